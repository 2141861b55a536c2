"""`check spec`'s spec.temperature: a lookahead gamma >= 6 meeting more than HOT_SHARE of requests above
temperature 1.2 is a WARN, read from the real router's /admin/spec in front of simulated SGLang workers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.checks.spec import HOT_SHARE, LONG_GAMMA, from_router, judge_temperature
from infer_ctl.cli.main import main
from infer_ctl.profile import Profile
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.sshd_harness import free_port

PRE_HOST, DEC_HOST = "127.0.0.43", "127.0.0.44"


def _profile(ports: dict[str, int], router_listen: str, steps: int) -> dict[str, Any]:
    return {
        "name": "spec-temp",
        "nodes": [
            {"name": "pf-01", "host": PRE_HOST, "connection": "local", "roles": ["prefill"],
             "overrides": {"prefill_port": ports["pre"], "bootstrap_port": ports["boot"]}},
            {"name": "dc-01", "host": DEC_HOST, "connection": "local", "roles": ["decode"],
             "overrides": {"decode_port": ports["dec"]}},
        ],
        "models": {"target": {"path": "sim-llama-3.1-70b", "tp": 8},
                   "draft": {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": steps, "eagle_topk": 1,
                             "num_draft_tokens": steps + 1}},
        "router": {"listen": router_listen},
        "speculative": {"window_requests": 200, "min_requests": 20, "alert_threshold": 0.5, "cost_ratio": 0.05},
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    ports = {"pre": free_port(PRE_HOST), "boot": free_port(PRE_HOST), "dec": free_port(DEC_HOST)}
    cluster = start_cluster_in_thread([
        WorkerSpec("prefill", host=PRE_HOST, port=ports["pre"], bootstrap_port=ports["boot"], time_scale=0.05),
        WorkerSpec("decode", host=DEC_HOST, port=ports["dec"], spec_alpha=0.8, spec_gamma=6, time_scale=0.05)])
    router = start_router_in_thread(router_config(prefill=[(cluster.workers[0].url, ports["boot"])],
                                                  decode=[cluster.workers[1].url], health_interval_s=0.3))
    path = tmp_path_factory.mktemp("spec-temp") / "profile.yaml"
    path.write_text(yaml.safe_dump(_profile(ports, router.url.removeprefix("http://"), 6)))
    yield {"router": router, "profile": str(path)}
    router.stop()
    cluster.stop()


def _send(url: str, temperatures: list[float]) -> None:
    with httpx.Client(timeout=60) as client:
        for i, t in enumerate(temperatures):
            r = client.post(url + "/generate", json={"text": f"sample {i} {t}", "stream": i % 2 == 1,
                                                     "sampling_params": {"max_new_tokens": 4, "temperature": t}})
            assert r.status_code == 200, r.text


def _temperature(capsys: pytest.CaptureFixture[str], profile: str) -> tuple[int, dict[str, Any]]:
    code = main(["check", "spec", "-p", profile, "--json"])
    rows = [f for f in json.loads(capsys.readouterr().out)["findings"] if f["check"] == "spec.temperature"]
    assert len(rows) == 1, rows
    return code, rows[0]


def test_gamma_6_on_hot_traffic_warns_and_cools_down_to_ok(setup: dict[str, Any],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    router, profile = setup["router"], setup["profile"]
    _send(router.url, [1.5] * 4)
    code, f = _temperature(capsys, profile)
    assert f["status"] == "skip" and "not judged yet" in f["message"]  # 4 < min_requests 20
    _send(router.url, [1.5] * 8 + [0.7] * 12)  # 12 of 24 above 1.2: 50 %
    code, f = _temperature(capsys, profile)
    assert f["status"] == "warn" and code == 1, f
    assert f["details"]["gamma"] == 6 and f["details"]["hot_share"] == 0.5 and f["node"] == "dc-01"
    assert "lookahead gamma 6" in f["message"] and "50% of its last 24 requests above temperature 1.2" in f["message"]
    assert "num_steps" in f["remedy"]
    _send(router.url, [0.0] * 30)  # 12 of 54: 22 %, not more than the quarter
    code, f = _temperature(capsys, profile)
    assert f["status"] == "ok", f


def test_short_lookahead_or_cool_traffic_is_not_judged() -> None:
    prof = Profile.model_validate(_profile({"pre": 1, "boot": 2, "dec": 3}, "127.0.0.1:9", 6))
    doc = {"decodes": [{"url": f"http://{DEC_HOST}:3", "num_steps": LONG_GAMMA - 1, "window": {"requests": 100},
                        "temperature_bands": {"window": {"0": 0, "0-0.7": 0, "0.7-1.2": 0, ">1.2": 100}}}]}
    assert judge_temperature(prof, from_router(doc)) == []  # gamma 5: any traffic is fine
    doc["decodes"][0]["num_steps"] = LONG_GAMMA
    bands = {"0": 75, "0-0.7": 0, "0.7-1.2": 0, ">1.2": 25}  # exactly the limit: not more than it
    doc["decodes"][0]["temperature_bands"]["window"] = bands
    (f,) = judge_temperature(prof, from_router(doc))
    assert f.status.value == "ok" and f.details["hot_share"] == HOT_SHARE
    bands[">1.2"] = 26
    (f,) = judge_temperature(prof, from_router(doc))
    assert f.status.value == "warn" and f.subject == "dc-01"
    assert judge_temperature(prof, from_router({"decodes": [{"url": "x", "num_steps": 7}]})) == []  # no bands

