"""The simulator behind SGLang's own Rust router (PyPI sglang-router 0.3.2), in PD mode.

Real parts: the router binary, real HTTP, the simulated prefill/decode workers and their bootstrap
server. The router injects bootstrap_host/port/room and sends each request to both workers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.ports import free_port

pytest.importorskip("sglang_router")


@pytest.fixture(scope="module")
def routed() -> Iterator[tuple[str, ThreadedSimCluster]]:
    specs = [WorkerSpec(r, time_scale=0.05) for r in ("prefill", "prefill", "decode", "decode")]
    cluster = start_cluster_in_thread(specs)
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    for w in cluster.workers[:2]:
        cmd += ["--prefill", w.url, str(w.bootstrap_port)]
    for w in cluster.workers[2:]:
        cmd += ["--decode", w.url]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(free_port()), "--log-level", "warn", "--shutdown-grace-period-secs", "1",
            "--worker-startup-check-interval", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # the launcher imports slowly on a loaded machine
        while True:
            try:
                r = httpx.post(base + "/generate", json={"text": "warm up", "sampling_params": {"max_new_tokens": 2}},
                               timeout=10)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None else ""
                pytest.fail(f"sglang-router did not come up: {err[-2000:]}")
            time.sleep(0.3)
        yield base, cluster
    finally:
        proc.terminate()
        try:
            proc.wait(3)
        except subprocess.TimeoutExpired:
            proc.kill()
        cluster.stop()


def _sse(r: httpx.Response) -> list[str]:
    return [ln[5:].strip() for ln in r.iter_lines() if ln.startswith("data:")]


def test_generate_non_stream(routed: tuple[str, ThreadedSimCluster]) -> None:
    base, cluster = routed
    system = "You are a careful assistant for Example Corp. " * 30
    metas = []
    for i in range(4):
        r = httpx.post(base + "/generate", json={"text": system + f"q{i}", "sampling_params": {"max_new_tokens": 16}},
                       timeout=30)
        assert r.status_code == 200, r.text
        metas.append(r.json()["meta_info"])
    assert all(m["completion_tokens"] == 16 for m in metas)
    # the router's cache-aware policy keeps a shared prefix on one prefill: later requests hit it
    assert max(m["cached_tokens"] for m in metas[1:]) > 100
    hit_rates = [httpx.get(w.url + "/v1/loads").json()["loads"][0]["cache_hit_rate"] for w in cluster.workers[:2]]
    assert max(hit_rates) > 0.3, "the prefill worker's own cache_hit_rate shows the reuse too"


def test_generate_stream(routed: tuple[str, ThreadedSimCluster]) -> None:
    base, _ = routed
    body = {"text": "stream through the rust router", "stream": True, "sampling_params": {"max_new_tokens": 12}}
    with httpx.stream("POST", base + "/generate", json=body, timeout=30) as r:
        assert r.status_code == 200
        data = _sse(r)
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["meta_info"]["completion_tokens"] == 12


def test_chat_non_stream(routed: tuple[str, ThreadedSimCluster]) -> None:
    base, _ = routed
    body = {"model": "sim-llama-3.1-70b", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 7}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 7


def test_chat_stream(routed: tuple[str, ThreadedSimCluster]) -> None:
    base, _ = routed
    body = {"model": "sim-llama-3.1-70b", "stream": True, "max_tokens": 7,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}]}
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        data = _sse(r)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
