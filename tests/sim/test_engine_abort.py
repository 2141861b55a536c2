"""A client that goes away while its prompt is in the running prefill step (in in-flight prefix
coalescing: a leader whose user closed the tab). The step's batch still held the aborted
request, `prefill_queue.remove` raised after the step, the GPU loop task died and every later request
waited forever (num_waiting_reqs stuck, nothing running)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx

from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.waiting import wait_for


def test_a_client_gone_mid_prefill_does_not_wedge_the_worker() -> None:
    # ~1 s of prefill for the prompt at time scale 1 (prefill_mfu 1.5 %): the abort lands mid-step
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=1.0, speculative=False, prefill_mfu=0.015)])
    url = cluster.workers[0].url
    try:
        prompt = " ".join(f"word{i % 50}" for i in range(1000))
        body = json.dumps({"text": prompt, "stream": True, "sampling_params": {"max_new_tokens": 1}}).encode()
        u = urlsplit(url)
        s = socket.create_connection((u.hostname, u.port), timeout=10)
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert wait_for(lambda: httpx.get(url + "/v1/loads", timeout=5).json()["loads"][0]["num_waiting_reqs"] == 1,
                        timeout=10)
        time.sleep(0.2)  # inside the step now
        s.close()
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(httpx.post, url + "/generate", json={"text": f"other {i}",
                                "sampling_params": {"max_new_tokens": 1}}, timeout=15) for i in range(2)]
            assert [f.result(timeout=20).status_code for f in futs] == [200, 200]
    finally:
        cluster.stop()


def test_a_dead_scheduler_loop_fails_the_health_check() -> None:
    # whatever kills the simulated scheduler (a bug like the one above), the worker must not keep saying
    # healthy while every request waits forever: SGLang's /health fails once its scheduler is gone
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.01, speculative=False)])
    worker = cluster.workers[0]
    try:
        assert httpx.get(worker.url + "/health", timeout=5).status_code == 200

        async def broken(loop: object) -> None:
            raise RuntimeError("injected scheduler failure")

        worker.running_engine()._prefill_step = broken  # type: ignore[method-assign]
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(worker.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}},
                       timeout=2)
        assert wait_for(lambda: httpx.get(worker.url + "/health", timeout=5).status_code == 503, timeout=10)
        assert "injected scheduler failure" in (worker.running_engine().failed or "")
    finally:
        cluster.stop()
