"""What answers at a worker's address: judged from /server_info (core/engine_identity.py), named by the
router's log when it first sees the worker. Real loopback HTTP servers stand in for a program that is not
SGLang and for an SGLang of another version (their /server_info bodies as those programs answer)."""

from __future__ import annotations

import json
import logging

import pytest

from infer_ctl.core.engine_identity import identify
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from tests.router.standin_http import StandinServer
from tests.waiting import wait_for

SGLANG = {"model_path": "/m", "tp_size": 8, "port": 30000, "version": "0.5.23"}


@pytest.mark.parametrize("info,status,kind", [
    (SGLANG, 200, "sglang"),
    ({**SGLANG, "version": "0.4.10"}, 200, "other-version"),
    ({**SGLANG, "frontend": "inferctl-sim"}, 200, "simulator"),
    ({"detail": "Not Found"}, 404, "not-sglang"),
    ({"model": "x", "version": "1.2"}, 200, "not-sglang"),  # e.g. another engine's info document
    ([1, 2], 200, "not-sglang"),
])
def test_identify(info: object, status: int, kind: str) -> None:
    got = identify(info, status=status)
    assert got.kind == kind, got
    assert got.summary


def test_pinned_version_is_the_profiles() -> None:
    assert identify({**SGLANG, "version": "0.5.24"}, pinned="0.5.24").kind == "sglang"


@pytest.mark.parametrize("path_answer,needle", [
    ({"/server_info": (404, b'{"detail":"Not Found"}')}, "not SGLang 0.5 or later"),
    ({"/server_info": (200, json.dumps({**SGLANG, "version": "0.4.10"}).encode())}, "SGLang 0.4.10, not the 0.5.23"),
])
def test_router_names_what_answers_at_a_worker(path_answer: dict[str, tuple[int, bytes]], needle: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    def answer(path: str) -> tuple[int, bytes]:
        return path_answer.get(path.split("?")[0], (200, b"{}"))

    worker = StandinServer(answer)
    caplog.set_level(logging.INFO, logger="infer_ctl.router")
    router = start_router_in_thread(router_config(workers=[worker.url], health_interval_s=0.2,
                                                  kv_events={"enabled": False}))
    try:
        assert wait_for(lambda: any(needle in r.getMessage() and r.levelno == logging.WARNING
                                    for r in caplog.records), timeout=10), [r.getMessage() for r in caplog.records]
    finally:
        router.stop()
        worker.close()


def test_check_servers_names_another_program_on_the_port() -> None:
    """A program that is not SGLang holds a server's port (here a JSON API answering 404 everywhere):
    besides /health failing, check servers says what answers there, so the remedy is not a relaunch that
    cannot bind the port."""
    from infer_ctl.checks.servers import _http_findings
    from infer_ctl.core.sglang import instances
    from infer_ctl.profile.load import validate_profile_data

    other = StandinServer(lambda path: (404, b'{"detail":"Not Found"}'))
    port = int(other.url.rsplit(":", 1)[1])
    try:
        profile = validate_profile_data({
            "name": "t", "collocated": True,
            "nodes": [{"name": "n1", "host": "127.0.0.1", "connection": "local", "roles": ["prefill", "decode"],
                       "gpus": 0}],
            "models": {"target": {"path": "/m", "tp": 1}},
            "sglang": {"collocated": {"port": port}, "extra_args": {"collocated": ["--device", "cpu"]}},
        })
        findings, _ = _http_findings(profile, list(instances(profile)))
    finally:
        other.close()
    got = {f.check: f for f in findings}
    assert got["servers.health"].status == "fail"
    assert got["servers.engine"].status == "fail" and "not SGLang" in got["servers.engine"].message
