"""Pairs that degrade, end to end: simulated PD workers (their KV transfers timed and reported as SGLang
0.5.23 reports them: the prefill's /v1/loads kv_transfer_speed_gb_s/_latency_ms of its last transfer)
behind the real router. A slowed transfer path (the simulator's /sim/kv/faults) degrades that one
prefill x decode pair, the router routes around it, says so in /admin/pairs, `router workers` and
/metrics, and takes it back after a probe once the path is fast again; failed transfers degrade a pair
without a failed request; an audit verdict pushed through POST /admin/pairs is obeyed."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.router.daemon.embed import RouterHandle
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_router, pd_specs

PROMPT = "Summarise the incident report for the on-call engineer. " * 12


@pytest.fixture
def cluster():  # type: ignore[no-untyped-def]
    c = start_cluster_in_thread(pd_specs(2, 2))
    yield c
    c.stop()


def gen(url: str, i: int) -> int:
    body = {"text": f"ticket {i}: " + PROMPT, "sampling_params": {"max_new_tokens": 2}}
    return httpx.post(url + "/generate", json=body, timeout=30).status_code


def pairs(router: RouterHandle) -> dict[tuple[str, str], dict]:
    doc = httpx.get(router.url + "/admin/pairs", timeout=10).json()
    return {(p["prefill"], p["decode"]): p for p in doc["pairs"]}


def fault(prefill_url: str, decode_url: str, **kw: object) -> None:
    r = httpx.post(prefill_url + "/sim/kv/faults", json={"decode": decode_url, **kw}, timeout=10)
    assert r.status_code == 200, r.text


def normal_speed(cluster: ThreadedSimCluster, router: RouterHandle) -> float:
    assert gen(router.url, 0) == 200
    speeds = [httpx.get(w.url + "/v1/loads", timeout=10).json()["loads"][0]["disaggregation"]["kv_transfer_speed_gb_s"]
              for w in cluster.workers]
    pre, dec = speeds[:2], speeds[2:]
    assert dec == [0.0, 0.0]  # SGLang reports them on the prefill only
    return max(pre)


def test_a_slow_kv_path_is_avoided_and_returns_after_a_probe(cluster: ThreadedSimCluster) -> None:
    p0, _p1, d0, _d1 = (w.url for w in cluster.workers)
    router = pd_router(cluster, health_interval_s=0.1)
    speed = normal_speed(cluster, router)
    router.stop()
    assert speed > 0
    router = pd_router(cluster, health_interval_s=0.1,
                       pair_health={"min_kv_speed_gb_s": speed / 3, "bad_samples": 2, "probe_after_s": 8.0})
    try:
        fault(p0, d0, slowdown=10)
        i = 0
        deadline = time.monotonic() + 60
        while not pairs(router).get((p0, d0), {}).get("degraded"):
            assert time.monotonic() < deadline, pairs(router)
            i += 1
            assert gen(router.url, i) == 200
            time.sleep(0.25)  # a health poll between requests: each transfer is seen alone
        st = pairs(router)[(p0, d0)]
        assert st["reason"] == "kv_slow" and st["kv_transfer_speed_gb_s"] < speed / 3 and st["bad_samples"] >= 2
        samples = st["samples"]
        # while it waits for its probe, no request crosses it; p0 and d0 still serve with their other pairs
        for _ in range(6):
            i += 1
            assert gen(router.url, i) == 200
            time.sleep(0.15)
        now = pairs(router)
        # still before its probe: with probe_after_s 4 the six requests ended 0.6 s before it at load ~9
        # (degraded_for_s 3.4), and past it a probe crossed the pair and moved its samples
        assert now[(p0, d0)]["degraded_for_s"] < 8.0, now[(p0, d0)]
        assert now[(p0, d0)]["samples"] == samples and now[(p0, d0)]["degraded"]
        workers = {w["url"]: w for w in httpx.get(router.url + "/admin/workers", timeout=10).json()["workers"]}
        assert workers[d0]["requests"] > 0 and workers[p0]["requests"] > 0
        text = httpx.get(router.url + "/metrics", timeout=10).text
        assert f'inferctl_router_pair_degraded{{decode="{d0}",prefill="{p0}",reason="kv_slow"}} 1.0' in text
        assert "inferctl_router_pair_avoided_total" in text
        # the path is fast again: after probe_after_s one request probes it and the pair returns
        fault(p0, d0)
        deadline = time.monotonic() + 60
        while pairs(router)[(p0, d0)]["degraded"]:
            assert time.monotonic() < deadline, pairs(router)[(p0, d0)]
            i += 1
            assert gen(router.url, i) == 200
            time.sleep(0.25)
        assert pairs(router)[(p0, d0)]["samples"] > samples
        text = httpx.get(router.url + "/metrics", timeout=10).text
        assert "reason=\"kv_slow\"" not in text
    finally:
        router.stop()


def test_failed_transfers_degrade_the_pair_without_failing_a_request(cluster: ThreadedSimCluster) -> None:
    _p0, p1, _d0, d1 = (w.url for w in cluster.workers)
    router = pd_router(cluster, health_interval_s=0.2,
                       pair_health={"max_transfer_failures": 2, "probe_after_s": 300.0})
    try:
        fault(p1, d1, fail=True)
        statuses = [gen(router.url, i) for i in range(40)]
        assert set(statuses) == {200}  # every failed transfer was retried on another pair
        st = pairs(router)[(p1, d1)]
        assert st["degraded"] and st["reason"] == "kv_failed" and st["transfers_failed"] == 2
        before = cluster.workers[1].rooms.transfer_failed
        assert [gen(router.url, 100 + i) for i in range(10)] == [200] * 10
        assert cluster.workers[1].rooms.transfer_failed == before  # no request was sent over it again
    finally:
        router.stop()


def test_pushed_pair_test_verdicts_and_the_workers_view(cluster: ThreadedSimCluster,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    p0, _p1, d0, _d1 = (w.url for w in cluster.workers)
    router = pd_router(cluster, health_interval_s=0.5)
    try:
        bad = httpx.post(router.url + "/admin/pairs", json={"prefill": p0, "decode": "http://nope:1", "status": "fail"})
        assert bad.status_code == 400
        r = httpx.post(router.url + "/admin/pairs", json={"prefill": p0, "decode": d0, "status": "fail",
                                                          "reason": "fabric.pingpong: transport retry counter exceeded"})
        assert r.status_code == 200 and r.json()["pair"]["reason"] == "pair_test"
        for i in range(12):
            assert gen(router.url, i) == 200
        assert pairs(router)[(p0, d0)]["samples"] == 0  # never used
        assert main(["router", "workers", "--url", router.url]) == 0
        out = capsys.readouterr().out
        assert "degraded pairs" in out and "pair_test" in out and "retry counter exceeded" in out
        assert main(["router", "workers", "--url", router.url, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [(p["prefill"], p["decode"]) for p in doc["pairs"] if p["degraded"]] == [(p0, d0)]
        httpx.post(router.url + "/admin/pairs", json={"prefill": p0, "decode": d0, "status": "ok"})
        assert not pairs(router)[(p0, d0)]["degraded"]
    finally:
        router.stop()


def test_router_workers_drain_and_undrain(cluster: ThreadedSimCluster, capsys: pytest.CaptureFixture[str]) -> None:
    _p0, _p1, d0, _d1 = (w.url for w in cluster.workers)
    router = pd_router(cluster, health_interval_s=0.5)
    try:
        assert main(["router", "workers", "drain", d0, "--url", router.url]) == 0
        assert f"drain: {d0}" in capsys.readouterr().out
        assert main(["router", "workers", "--url", router.url]) == 0
        (row,) = [line for line in capsys.readouterr().out.splitlines() if d0 in line]
        assert "drain" in row  # the state column (cut to the 80-column table's width)
        before = {w["url"]: w["requests"] for w in httpx.get(router.url + "/admin/workers").json()["workers"]}
        assert [gen(router.url, i) for i in range(6)] == [200] * 6
        after = {w["url"]: w["requests"] for w in httpx.get(router.url + "/admin/workers").json()["workers"]}
        assert after[d0] == before[d0]  # nothing new reached the drained decode
        assert main(["router", "workers", "undrain", d0, "--url", router.url]) == 0
        assert not {w["url"]: w for w in httpx.get(router.url + "/admin/workers").json()["workers"]}[d0]["draining"]
        assert main(["router", "workers", "drain", "--url", router.url]) == 64  # no URL: usage error
    finally:
        router.stop()
