"""The router on SGLang's KV events, end to end: simulated workers started with a KV-events config behind
the real router. The exact index holds exactly the blocks each simulated prefill's radix tree holds;
predicted cached tokens match what the workers report within 2 % per request; a prefill killed with
SIGKILL under load loses no non-streaming request, its index is dropped at once and rebuilt from its
events after it comes back."""

from __future__ import annotations

import json
import logging
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.core.kvevents.hashing import block_hashes, last_digest, page_digests
from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer, render_chat
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE
from tests.sim.kv_client import free_port, kv_config
from tests.waiting import wait_for

WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health", "inference", "journal", "kernel", "latency"]


def tree_blocks(worker: Any) -> set[int]:
    """Every block hash a simulated worker's radix tree holds, computed from the tree itself."""
    cache = worker.cache
    out: set[int] = set()
    stack: list[tuple[Any, bytes | None]] = [(cache.root, None)]
    while stack:
        node, prior = stack.pop()
        for child in node.children.values():
            digests = page_digests(child.key, cache.page_size, prior, bigram=cache.bigram)
            out.update(block_hashes(digests))
            stack.append((child, last_digest(digests) or prior))
    return out


def prompt(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def kv_cluster() -> Iterator[ThreadedSimCluster]:
    kw: dict[str, Any] = {"time_scale": TIME_SCALE, "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    specs = [WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
             WorkerSpec("prefill", kv_events_config=kv_config(), page_size=4, speculative=False, **kw),
             WorkerSpec("decode", kv_events_config=kv_config(), **kw)]
    cluster = start_cluster_in_thread(specs)
    yield cluster
    cluster.stop()


def kv_router(prefill: list[tuple[str, int | None]], decode: list[str], **kw: Any) -> RouterHandle:
    kw.setdefault("health_interval_s", 0.3)
    kw.setdefault("warm_via", "pair")
    return start_router_in_thread(router_config(prefill=prefill, decode=decode, **kw))


def workers_doc(router: RouterHandle) -> dict[str, dict[str, Any]]:
    doc = httpx.get(router.url + "/admin/workers", timeout=5).json()
    return {w["url"]: w for w in doc["workers"]}


def exact_everywhere(router: RouterHandle, urls: list[str]) -> bool:
    docs = workers_doc(router)
    return all(docs[u].get("index") == "exact" for u in urls)


def test_exact_index_equals_the_simulated_trees(kv_cluster: ThreadedSimCluster) -> None:
    pre = [w for w in kv_cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in kv_cluster.workers if w.spec.role == "decode"]
    router = kv_router([(w.url, w.bootstrap_port) for w in pre], dec)
    try:
        assert wait_for(lambda: exact_everywhere(router, [w.url for w in pre]))
        rng = random.Random(3)
        prefixes = [prompt(rng, 300) for _ in range(3)]
        with httpx.Client(timeout=30) as c:
            for i in range(12):
                r = c.post(router.url + "/generate", json={"text": prefixes[i % 3] + " " + prompt(rng, 10),
                                                            "sampling_params": {"max_new_tokens": 2}})
                assert r.status_code == 200
            r = c.post(router.url + "/v1/chat/completions", json={"messages": [
                {"role": "system", "content": prefixes[0]}, {"role": "user", "content": "hi"}], "max_tokens": 2})
            assert r.status_code == 200
        kv = router.router.kv

        def same() -> bool:
            return all(router.call(_blocks(kv, w.url)) == tree_blocks(w) for w in pre)

        assert wait_for(same, timeout=10), {w.url: (len(router.call(_blocks(kv, w.url))), len(tree_blocks(w)))
                                            for w in pre}
        assert all(tree_blocks(w) for w in pre)  # both prefills got traffic
        docs = workers_doc(router)
        for w in pre:
            d = docs[w.url]
            assert d["index"] == "exact" and d["kv_blocks"] == len(tree_blocks(w))
            assert d["kv_streams"][0]["bigram"] is (w.spec.page_size == 1)
        metrics = httpx.get(router.url + "/metrics").text
        assert "inferctl_router_kv_events_total{" in metrics
        assert 'inferctl_router_kv_index_state{state="exact"' in metrics
        # a flush through the router: the workers publish AllBlocksCleared, the exact index follows
        assert httpx.post(router.url + "/flush_cache", timeout=10).status_code == 200
        assert wait_for(lambda: all(not router.call(_blocks(kv, w.url)) for w in pre))
    finally:
        router.stop()


async def _blocks(kv: Any, url: str) -> set[int]:
    w = kv.workers[url]
    return set().union(*(s.blocks.device for s in w.streams))


def test_predicted_cached_tokens_within_two_percent_per_request(kv_cluster: ThreadedSimCluster,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    pre = [w for w in kv_cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in kv_cluster.workers if w.spec.role == "decode"]
    for w in kv_cluster.workers:
        httpx.post(w.url + "/flush_cache", timeout=10)
    router = kv_router([(w.url, w.bootstrap_port) for w in pre], dec, log_requests=True)
    tok = BuiltinTokenizer()
    rng = random.Random(7)
    tenants = [f"You are assistant {i}. Policy: " + prompt(rng, 2000) for i in range(4)]
    sent: list[tuple[str, int]] = []
    try:
        assert wait_for(lambda: exact_everywhere(router, [w.url for w in pre]))
        caplog.set_level(logging.INFO, logger="infer_ctl.router")
        kv = router.router.kv
        with httpx.Client(timeout=60) as c:
            for i in range(40):
                t = tenants[rng.randrange(4)]
                rid = f"acc-{i}"
                if i % 4 == 3:  # chat: the prompt is the worker's template around the conversation
                    msgs: list[dict[str, object]] = [{"role": "system", "content": t}, {"role": "user", "content": prompt(rng, 20)}]
                    r = c.post(router.url + "/v1/chat/completions", headers={"x-request-id": rid},
                               json={"messages": msgs, "max_tokens": 2})
                    n = len(tok.encode(render_chat(msgs)))
                else:
                    text = t + " Q: " + prompt(rng, 30)
                    r = c.post(router.url + "/generate", headers={"x-request-id": rid},
                               json={"text": text, "sampling_params": {"max_new_tokens": 2}})
                    n = len(tok.encode(text))
                assert r.status_code == 200, r.text
                sent.append((rid, n))
                # the worker's events reached the router before the next decision (a fixed 0.1 s was not
                # always enough on a loaded machine: a prediction made without them is off by the prompt)
                assert wait_for(lambda: all(router.call(_blocks(kv, w.url)) == tree_blocks(w) for w in pre), 10)
        done = {r.rid: r for r in caplog.records if r.getMessage() == "request done"}  # type: ignore[attr-defined]
        hits = 0
        for rid, n in sent:
            rec = done[rid]
            predicted, actual = rec.predicted_tokens, rec.cached_tokens  # type: ignore[attr-defined]
            assert actual is not None
            assert abs(predicted - actual) <= 0.02 * n, (rid, predicted, actual, n)
            hits += actual > 0.5 * n
        assert hits >= 25  # the workload is mostly hits: the bound is not met by predicting 0 for 0
        docs = workers_doc(router)
        for w in pre:
            acc = docs[w.url]["cached_tokens"]
            assert acc["requests"] and abs(acc["exact"] - acc["reported"]) <= 0.02 * sum(n for _, n in sent)
    finally:
        router.stop()


def _serve_prefill(port: int, bport: int, cfg: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl", "sim", "serve", "--worker", f"prefill@127.0.0.1:{port}/{bport}",
         "--time-scale", str(TIME_SCALE), "--kv-events-config", cfg, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    json.loads(proc.stdout.readline())  # serving
    return proc


def test_sigkill_of_a_prefill_under_load(kv_cluster: ThreadedSimCluster) -> None:
    port, bport = free_port(), free_port()
    cfg = kv_config()
    victim = f"http://127.0.0.1:{port}"
    proc = _serve_prefill(port, bport, cfg)
    other = next(w for w in kv_cluster.workers if w.spec.role == "prefill" and w.spec.page_size == 4)
    dec = [w.url for w in kv_cluster.workers if w.spec.role == "decode"]
    router = kv_router([(victim, bport), (other.url, other.bootstrap_port)], dec)
    statuses: list[int] = []
    errors: list[str] = []
    stop = threading.Event()
    rng = random.Random(11)
    tenants = [prompt(rng, 200) for _ in range(6)]

    def client(k: int) -> None:
        r2 = random.Random(k)
        with httpx.Client(timeout=60) as c:
            while not stop.is_set():
                try:
                    r = c.post(router.url + "/generate", json={"text": r2.choice(tenants) + " " + prompt(r2, 5),
                                                                "sampling_params": {"max_new_tokens": 2}})
                    statuses.append(r.status_code)
                except httpx.HTTPError as exc:  # pragma: no cover - would be a failure
                    errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    try:
        assert wait_for(lambda: exact_everywhere(router, [victim, other.url]))
        for t in threads:
            t.start()
        assert wait_for(lambda: workers_doc(router)[victim]["kv_blocks"] > 0 and len(statuses) > 20)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        # dropped once the router sees the worker gone (a failed request triggers a health check)
        assert wait_for(lambda: (d := workers_doc(router)[victim])["index"] != "exact" and d["kv_blocks"] == 0,
                        timeout=10)
        dropped_after = time.monotonic() - killed
        n_down = len(statuses)
        assert wait_for(lambda: len(statuses) > n_down + 10)  # traffic goes on, on the other prefill
        proc = _serve_prefill(port, bport, cfg)  # back, same ports, a new process
        assert wait_for(lambda: workers_doc(router)[victim]["index"] == "exact", timeout=20)
        # its index is learned from its own events again: new prompts (no worker holds them) are spread
        # by the fallback, some land on it, and its stores come back as blocks (how many land there
        # depends on the load the other clients put on each prefill: as many as it takes, within bounds)
        with httpx.Client(timeout=60) as c:
            for _ in range(60):
                r = c.post(router.url + "/generate", json={"text": prompt(rng, 300),
                                                            "sampling_params": {"max_new_tokens": 2}})
                assert r.status_code == 200
                if wait_for(lambda: workers_doc(router)[victim]["kv_blocks"] > 0, timeout=0.5):
                    break
        assert wait_for(lambda: workers_doc(router)[victim]["kv_blocks"] > 0, timeout=10), (
            workers_doc(router)[victim], httpx.get(router.url + "/admin/pairs", timeout=5).text)
        stop.set()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a client request still runs after 60 s"
        assert wait_for(lambda: router.router.active == 0, timeout=5), router.where()
        assert errors == []
        assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        assert dropped_after < 5
    finally:
        stop.set()
        router.stop()
        proc.kill()
        proc.wait(10)
