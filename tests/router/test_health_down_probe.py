"""A worker that is down is probed every second between health rounds (router/health.py DOWN_PROBE_S):
restarted, it takes traffic again within a second of answering, not a health interval later."""

from __future__ import annotations

import time

import httpx

from infer_ctl.router.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.waiting import wait_for


def test_a_restarted_worker_is_back_within_a_second_not_a_health_interval() -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.1, speculative=False) for _ in range(2)])
    router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=30.0, health_failures=1,
                                                  policy="round_robin", retry_base_s=0.01))
    try:
        w = router.router.workers.by_url[cluster.urls[1]]
        cluster.stop_worker(1)
        body = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
        for _ in range(4):  # round robin: one of them meets the dead worker (retried), and its check
            assert httpx.post(router.url + "/generate", json=body, timeout=10).status_code == 200
        assert wait_for(lambda: not w.healthy, timeout=5)
        cluster.start_worker(1)  # back on the same port
        t0 = time.monotonic()
        assert wait_for(lambda: w.healthy, timeout=5)
        assert time.monotonic() - t0 < 3.0
    finally:
        router.stop()
        cluster.stop()
