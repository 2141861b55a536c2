"""`inferctl check spec` against simulated SGLang decodes behind the real router: OK at alpha 0.8, WARN
(naming the recommended gamma) within one window after a drift to 0.4, FAIL exit 2 below break-even, the
tokenizer advice near alpha 0 with the last tokenizer result of the audit history; and from the workers'
own /metrics + /server_info when there is no router."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.checks.registry import families
from infer_ctl.cli.main import main
from infer_ctl.core.routing.spec_fields import alpha_from_mean_correct, decode_metrics_text
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.sshd_harness import free_port

SCALE = 0.05
PRE_HOST, DEC_HOST = "127.0.0.41", "127.0.0.42"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ports = {"pre": free_port(PRE_HOST), "boot": free_port(PRE_HOST), "dec": free_port(DEC_HOST)}
    specs = [WorkerSpec("prefill", host=PRE_HOST, port=ports["pre"], bootstrap_port=ports["boot"], time_scale=SCALE),
             WorkerSpec("decode", host=DEC_HOST, port=ports["dec"], spec_alpha=0.8, time_scale=SCALE)]
    cluster = start_cluster_in_thread(specs)
    router = start_router_in_thread(router_config(prefill=[(cluster.workers[0].url, ports["boot"])],
                                                  decode=[cluster.workers[1].url], health_interval_s=0.3,
                                                  spec_window_requests=200))
    tmp = tmp_path_factory.mktemp("spec")
    profile = {
        "name": "spec-check",
        "nodes": [
            {"name": "pf-01", "host": PRE_HOST, "connection": "local", "roles": ["prefill"],
             "overrides": {"prefill_port": ports["pre"], "bootstrap_port": ports["boot"]}},
            {"name": "dc-01", "host": DEC_HOST, "connection": "local", "roles": ["decode"],
             "overrides": {"decode_port": ports["dec"]}},
        ],
        "models": {"target": {"path": "sim-llama-3.1-70b", "tp": 8},
                   "draft": {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                             "num_draft_tokens": 4}},
        "router": {"listen": router.url.removeprefix("http://")},
        "speculative": {"window_requests": 200, "min_requests": 50, "alert_threshold": 0.5, "cost_ratio": 0.1},
    }
    path = tmp / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    yield {"cluster": cluster, "router": router, "profile": str(path), "tmp": tmp}
    router.stop()
    cluster.stop()


def _send(router: RouterHandle, n: int) -> None:
    async def go() -> None:
        sem = asyncio.Semaphore(16)
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(i: int) -> None:
                async with sem:
                    r = await client.post(router.url + "/generate", json={
                        "text": f"question {i} on the cluster", "sampling_params": {"max_new_tokens": 48},
                        "stream": i % 2 == 0})
                    assert r.status_code == 200
            await asyncio.gather(*(one(i) for i in range(n)))
    asyncio.run(go())


def _shift(cluster: ThreadedSimCluster, alpha: float) -> None:
    r = httpx.post(cluster.workers[1].url + "/sim/spec/alpha", json={"domain": "default", "alpha": alpha})
    assert r.status_code == 200, r.text


def _check(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "spec", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _acceptance(doc: dict[str, Any]) -> dict[str, Any]:
    rows = [f for f in doc["findings"] if f["check"] == "spec.acceptance"]
    assert len(rows) == 1, doc["findings"]
    return dict(rows[0])


def test_ok_then_warn_after_a_drift_then_fail_below_break_even(setup: dict[str, Any],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster, router, profile = setup["cluster"], setup["router"], setup["profile"]
    _shift(cluster, 0.8)
    code, doc = _check(capsys, "-p", profile)
    assert code == 0 and _acceptance(doc)["status"] == "skip"  # nothing measured yet: not judged

    _send(router, 200)
    code, doc = _check(capsys, "-p", profile)
    f = _acceptance(doc)
    assert code == 0 and f["status"] == "ok", f
    assert abs(f["details"]["alpha"] - 0.8) <= 0.02 and f["node"] == "dc-01" and f["subject"] == "dc-01-decode"

    _shift(cluster, 0.4)  # the domain drifted: within one window (200 requests) it must WARN
    _send(router, 200)
    code, doc = _check(capsys, "-p", profile)
    f = _acceptance(doc)
    assert code == 1 and f["status"] == "warn", f
    assert "recommended gamma 2" in f["message"] and "below the alert threshold 0.5" in f["message"]
    assert abs(f["details"]["alpha"] - 0.4) <= 0.03

    _shift(cluster, 0.15)  # below the break-even of 3 steps at c 0.1 (~0.23): slower than none
    _send(router, 200)
    code, doc = _check(capsys, "-p", profile)
    f = _acceptance(doc)
    assert code == 2 and f["status"] == "fail", f
    assert "slower than none" in f["message"] and "disable speculation or change the draft" in f["remedy"]
    assert main(["check", "spec", "-p", profile]) == 2
    assert "slower than none" in capsys.readouterr().out


def test_near_zero_points_at_the_tokenizer_and_shows_its_last_result(setup: dict[str, Any],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    cluster, router, profile, tmp = setup["cluster"], setup["router"], setup["profile"], setup["tmp"]
    history = tmp / "audit.jsonl"
    lines = [
        {"ts": "2026-01-01T00:00:00Z", "profile": "spec-check", "families": ["tokenizer"], "findings": [
            ["tokenizer.special_tokens", "local", "bos", "fail", "bos_token differs: <s> vs <|begin_of_text|>"]]},
        {"ts": "2026-01-02T00:00:00Z", "profile": "spec-check", "kind": "spec_action", "pool": "dc-01"},
        {"ts": "2026-01-02T00:00:00Z", "profile": "other", "families": ["tokenizer"], "findings": []},
    ]
    history.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _shift(cluster, 0.01)  # what a draft with another tokenizer accepts: by accident
    _send(router, 200)
    code, doc = _check(capsys, "-p", profile, "--history", str(history))
    f = _acceptance(doc)
    assert code == 2 and f["status"] == "fail"
    assert "`inferctl check tokenizer`" in f["remedy"]
    assert "last tokenizer check: fail: bos_token differs" in f["message"] and "2026-01-01" in f["message"]
    _shift(cluster, 0.8)


def test_without_a_router_the_workers_gauges_are_read(setup: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    cluster, router, profile = setup["cluster"], setup["router"], setup["profile"]
    _shift(cluster, 0.8)
    _send(router, 60)
    _code, doc = _check(capsys, "-p", profile, "--workers")
    f = _acceptance(doc)
    assert doc["source"] == "workers" and f["details"]["source"] == "metrics"
    # SGLang's gauges hold the last 40-batch interval only (noisy at a run's tail): the finding is what
    # the gauges say, decoded the same way
    gauges = decode_metrics_text(httpx.get(cluster.workers[1].url + "/metrics").text)
    assert gauges.accept_rate and gauges.num_draft_tokens == 4
    expected = alpha_from_mean_correct(gauges.accept_rate * 3, 3)
    assert expected is not None and f["details"]["alpha"] == pytest.approx(expected, abs=1e-3)
    assert f["details"]["accept_length"] == pytest.approx(gauges.accept_length)
    assert f["status"] == ("ok" if expected >= 0.5 else "warn" if expected >= 0.23 else "fail") and expected > 0.4
    assert "decode-log interval" in f["message"]
    # a profile whose router is not running falls back to the workers by itself
    data = yaml.safe_load(Path(profile).read_text())
    data["router"]["listen"] = f"127.0.0.1:{free_port('127.0.0.1')}"
    other = Path(profile).with_name("norouter.yaml")
    other.write_text(yaml.safe_dump(data))
    _code, doc = _check(capsys, "-p", str(other))
    assert doc["source"] == "workers" and doc["router_error"]


def test_spec_is_an_audit_family_under_both_names() -> None:
    assert [f.name for f in families({"spec"})] == ["spec"]
    assert [f.name for f in families({"speculative"})] == ["spec"]


def test_bad_profile_is_exit_64(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "nodes": [{"name": "a", "host": "h", "roles": ["prefill", "decode"]}],
                                   "speculative": {"min_steps": 4, "max_steps": 2}}))
    assert main(["check", "spec", "-p", str(bad)]) == 64
    assert "speculative.min_steps" in capsys.readouterr().err


def test_nothing_running_is_unknown_not_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster whose servers (and router) are down: each decode is a SKIP (its health is `check servers`'
    FAIL), and the family as a whole measured nothing, which is UNKNOWN (exit 3), never OK (exit 0)."""
    data = {"name": "down", "nodes": [
        {"name": "pf-01", "host": "127.0.0.43", "connection": "local", "roles": ["prefill"],
         "overrides": {"prefill_port": free_port("127.0.0.43")}},
        {"name": "dc-01", "host": "127.0.0.44", "connection": "local", "roles": ["decode"],
         "overrides": {"decode_port": free_port("127.0.0.44")}}],
        "models": {"target": {"path": "/m"}, "draft": {"path": "/d", "algorithm": "EAGLE3"}},
        "router": {"listen": f"127.0.0.1:{free_port('127.0.0.1')}"}}
    path = tmp_path / "down.yaml"
    path.write_text(yaml.safe_dump(data))
    code, doc = _check(capsys, "-p", str(path))
    assert code == 3 and doc["source"] == "workers" and doc["status"] == "unknown"
    assert [(f["check"], f["status"]) for f in doc["findings"]] == [("spec.source", "skip"), ("spec.source", "unknown")]
    assert "no decode server answered" in doc["findings"][1]["message"]
