"""Reliability: a decode killed and restarted under load, restart detection, limits (413/429), drain,
admin auth. Real simulated workers and the real router on loopback."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig, worker
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import start_cluster_in_thread
from tests.router.conftest import pd_router, pd_specs
from tests.waiting import wait_for

PROMPT = "Shared instructions for the fault test. " * 10


def gen(url: str, text: str, n: int = 4, timeout: float = 30) -> httpx.Response:
    params = {"max_new_tokens": n, "ignore_eos": True}
    return httpx.post(url + "/generate", json={"text": text, "sampling_params": params}, timeout=timeout)


def worker_state(router: Any, url: str) -> dict[str, Any]:
    """One worker's entry of the admin API's /admin/workers."""
    states = {w["url"]: w for w in httpx.get(router.url + "/admin/workers", timeout=10).json()["workers"]}
    return dict(states[url])


def test_decode_killed_and_restarted_under_load_loses_no_request() -> None:
    cluster = start_cluster_in_thread(pd_specs(2, 2))
    router = pd_router(cluster, max_retries=3, cb_failures=3, cb_open_s=0.5)
    stop = threading.Event()
    statuses: list[int] = []
    errors: list[str] = []

    def client(i: int) -> None:
        with httpx.Client(timeout=30) as c:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    r = c.post(router.url + "/generate", json={"text": f"client {i} req {n} " + PROMPT,
                                                               "sampling_params": {"max_new_tokens": 16}})
                    statuses.append(r.status_code)
                except httpx.HTTPError as exc:  # pragma: no cover - would be a failure
                    errors.append(repr(exc))

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        decode0 = cluster.workers[2].url
        assert wait_for(lambda: len(statuses) >= 30, timeout=30)  # load is flowing through both decodes
        cluster.stop_worker(2)  # decode 0 dies with requests in flight
        assert wait_for(lambda: not (s := worker_state(router, decode0))["healthy"] or s["circuit_breaker"] != "closed",
                        timeout=15)
        cluster.start_worker(2)  # and comes back on the same port
        # health checks mark it healthy again and traffic closes its breaker
        assert wait_for(lambda: (s := worker_state(router, decode0))["healthy"] and s["circuit_breaker"] == "closed",
                        timeout=15)
        stop.set()
        for t in threads:
            t.join(30)
        assert errors == []
        assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        back = worker_state(router, decode0)
        assert back["healthy"] and back["circuit_breaker"] == "closed"
        assert "inferctl_router_retries_total{cause=" in httpx.get(router.url + "/metrics").text
        # traffic reaches the restarted decode again
        before = back["requests"]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: gen(router.url, f"after {i}"), range(12)))
        assert worker_state(router, decode0)["requests"] > before
    finally:
        stop.set()
        router.stop()
        cluster.stop()


def test_prefill_restart_drops_its_index_entries() -> None:
    cluster = start_cluster_in_thread(pd_specs(1, 1))
    router = pd_router(cluster, health_interval_s=0.2)
    try:
        assert gen(router.url, PROMPT).status_code == 200
        r = router.router
        url = cluster.workers[0].url
        assert r.index.footprint(url) > 0
        cluster.start_worker(0)  # restart: fresh cache, new /server_info start time
        assert wait_for(lambda: r.workers.by_url[url].restarts > 0)
        assert r.workers.by_url[url].restarts == 1
        assert r.index.footprint(url) == 0
        assert gen(router.url, PROMPT).status_code == 200
    finally:
        router.stop()
        cluster.stop()


def test_body_limit_413_and_concurrency_limit_429() -> None:
    cluster = start_cluster_in_thread(pd_specs(1, 1, time_scale=0.5))  # slow: ~10 ms per token
    router = pd_router(cluster, max_body_bytes=2048, max_concurrent=1, max_queue=0)
    try:
        big = gen(router.url, "x" * 4096)
        assert big.status_code == 413 and big.json()["error"]["type"] == "invalid_request_error"
        assert big.json() == {"error": {"message": "request body over 2048 bytes", "type": "invalid_request_error",
                                        "code": 413}}
        with ThreadPoolExecutor(2) as pool:
            slow = pool.submit(gen, router.url, "slow one", 600)
            assert wait_for(lambda: router.router.active == 1)
            fast = pool.submit(gen, router.url, "second", 1)
            assert fast.result().status_code == 429
            assert fast.result().json()["error"]["type"] == "rate_limit_error"
            assert fast.result().json() == {"error": {"message": "too many concurrent requests; retry later",
                                                      "type": "rate_limit_error", "code": 429}}
            assert slow.result().status_code == 200
    finally:
        router.stop()
        cluster.stop()


def test_graceful_shutdown_finishes_in_flight_requests() -> None:
    cluster = start_cluster_in_thread(pd_specs(1, 1, time_scale=0.5))
    router = pd_router(cluster, drain_timeout_s=20)
    try:
        with ThreadPoolExecutor(3) as pool:
            inflight = [pool.submit(gen, router.url, f"in flight {i}", 600) for i in range(2)]
            assert wait_for(lambda: router.router.active == 2)
            stopper = pool.submit(router.stop)
            assert wait_for(lambda: router.router.draining)
            late = httpx.post(router.url + "/generate", json={"text": "late"}, timeout=5)
            assert late.status_code == 503  # draining: refused, not dropped
            assert late.json() == {"error": {"message": "router is shutting down; retry on another router",
                                             "type": "server_error", "code": 503}}
            assert [f.result().status_code for f in inflight] == [200, 200]
            stopper.result()
    finally:
        router.stop()
        cluster.stop()


def test_admin_api_requires_the_bearer_token() -> None:
    cluster = start_cluster_in_thread(pd_specs(1, 1))
    router = pd_router(cluster, admin_token="s3cret")
    try:
        assert httpx.get(router.url + "/admin/status").status_code == 401
        assert httpx.get(router.url + "/admin/status", headers={"Authorization": "Bearer nope"}).status_code == 401
        ok = httpx.get(router.url + "/admin/status", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["mode"] == "pd"
        assert httpx.get(router.url + "/health").status_code == 200  # data plane stays open
    finally:
        router.stop()
        cluster.stop()


def test_refuses_non_loopback_listener_without_token() -> None:
    cfg = RouterConfig(host="0.0.0.0", port=0, workers=[worker("http://127.0.0.1:1", "mixed")])
    with pytest.raises(UsageError, match="without a token"):
        cfg.validate()
    cfg.admin_token = "t"
    cfg.validate()
    with pytest.raises(UsageError, match="PD mode needs"):
        RouterConfig(workers=[worker("http://127.0.0.1:1", "prefill", 1)]).validate()


def test_no_available_worker_is_a_503_with_a_remedy() -> None:
    # Port 9 (discard) refuses connections: the health check at start-up already marks the only worker
    # unhealthy (health_failures=1), so no attempt is made and the router answers 503 itself. (A 502 is
    # the answer when attempts were made and all failed: tests/router/request/test_errors.py.)
    router = start_router_in_thread(router_config(workers=["http://127.0.0.1:9"], health_interval_s=0.1,
                                                  health_failures=1))
    try:
        r = httpx.post(router.url + "/generate", json={"text": "x"}, headers={"X-Request-Id": "req-503"}, timeout=10)
        assert r.status_code == 503 and r.headers["x-request-id"] == "req-503"
        assert "retry-after" not in r.headers  # down, not held: nobody knows when it is back
        assert r.json() == {"error": {"message": "no available worker; check `inferctl router workers`",
                                      "type": "server_error", "code": 503}}
        assert 'inferctl_router_rejected_total{reason="no_worker"} 1.0' in httpx.get(router.url + "/metrics").text
        health = httpx.get(router.url + "/health")
        assert health.status_code == 503
        assert health.json() == {"status": "unavailable", "draining": False, "available": {"worker": False}}
    finally:
        router.stop()
