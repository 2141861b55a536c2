"""Cluster lifecycle (16 workers in one process, stop/restart on the same port), determinism under a
seed, and the live speculative statistics of a worker."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from infer_ctl.core.sizing.spec import expected_tokens
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.sim.conftest import FAST


def test_sixteen_workers_in_one_process_serve_pd_pairs() -> None:
    specs = [WorkerSpec("prefill" if i % 2 == 0 else "decode", time_scale=FAST) for i in range(16)]
    with start_cluster_in_thread(specs) as c:
        assert len(set(c.urls)) == 16

        def pair(i: int) -> tuple[int, int]:
            p, d = c.workers[2 * i], c.workers[2 * i + 1]
            body = {"text": f"pair {i}", "sampling_params": {"max_new_tokens": 16}, "bootstrap_host": "127.0.0.1",
                    "bootstrap_port": p.bootstrap_port, "bootstrap_room": 1000 + i}
            with cf.ThreadPoolExecutor(2) as ex:
                fp = ex.submit(httpx.post, p.url + "/generate", json=body, timeout=30)
                fd = ex.submit(httpx.post, d.url + "/generate", json=body, timeout=30)
                return fp.result().status_code, fd.result().status_code

        with cf.ThreadPoolExecutor(8) as ex:
            assert list(ex.map(pair, range(8))) == [(200, 200)] * 8


def test_stop_and_restart_worker_on_the_same_port() -> None:
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST), WorkerSpec("prefill", time_scale=FAST)]) as c:
        url, boot = c.urls[0], c.workers[1].bootstrap_port
        before = httpx.get(url + "/server_info").json()["startup_time"]
        c.stop_worker(0)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
        time.sleep(0.01)
        c.start_worker(0)
        c.stop_worker(1)
        c.start_worker(1)
        assert c.urls[0] == url and c.workers[1].bootstrap_port == boot
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/server_info").json()["startup_time"] > before
        assert httpx.get(f"http://127.0.0.1:{boot}/health").text == "OK"


def _run(seed: int) -> list[tuple[list[int], int]]:
    with start_cluster_in_thread([WorkerSpec("mixed", seed=seed, time_scale=FAST)]) as c:
        out = []
        for prompt in ("alpha beta", "gamma delta", "alpha beta"):
            meta = httpx.post(c.urls[0] + "/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 40}}).json()
            out.append((meta["output_ids"], meta["meta_info"]["spec_verify_ct"]))
        return out


def test_deterministic_under_a_seed() -> None:
    a, b, other = _run(3), _run(3), _run(4)
    assert a == b
    assert a != other
    assert a[0] == a[2], "the same request gives the same tokens"


def test_live_spec_accept_length_matches_expected_tokens() -> None:
    alpha, gamma = 0.7, 4
    spec = WorkerSpec("mixed", time_scale=0.002, spec_alpha=alpha, spec_gamma=gamma)
    with start_cluster_in_thread([spec]) as c:
        body = {"text": [f"stat {i}" for i in range(8)], "sampling_params": {"max_new_tokens": 2000}}
        results = httpx.post(c.urls[0] + "/generate", json=body, timeout=60).json()
        metrics = httpx.get(c.urls[0] + "/metrics").text
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    verifies = sum(r["meta_info"]["spec_verify_ct"] for r in results)
    # The first token comes from prefill, and the last verification may be cut short by max_new_tokens.
    accept_length = (tokens - len(results)) / verifies
    assert accept_length == pytest.approx(expected_tokens(alpha, gamma), rel=0.05)
    assert "sglang:spec_accept_length" in metrics
