"""A long prompt is predicted only once its worker took it (router/request/picker.py `_long`).

Inserted at routing time, a prompt the worker then rejects (over its context: 400) evicted the
predicted index's entries of every other prompt on that worker: one oversized request collapsed
cache-aware routing. Two simulated mixed workers with a small KV cache: the normal prompts stay
predicted after rejected long prompts (unary and streamed), and a long prompt the worker answers is
predicted once answered."""

from __future__ import annotations

import random

import httpx

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.waiting import wait_for

WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health", "inference", "journal"]


def _text(rng: random.Random, chars: int) -> str:
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def _held(h: RouterHandle, texts: list[str]) -> int:
    """How many of `texts` the predicted index holds whole on some worker."""
    r = h.router
    now = r.clock()
    n = 0
    for t in texts:
        hashes = r.index.hashes(t)
        full = len(hashes) * r.index.block_chars
        n += any(v == full for v in r.index.match(hashes, r.index.workers(), now).values())
    return n


def test_a_rejected_long_prompt_leaves_the_prediction_and_an_answered_one_is_predicted() -> None:
    rng = random.Random(7)
    spec = {"time_scale": 0.001, "cache_capacity_tokens": 20_000, "context_length": 8_192}
    c = start_cluster_in_thread([WorkerSpec("mixed", **spec), WorkerSpec("mixed", **spec)])  # type: ignore[arg-type]
    try:
        cfg = router_config(workers=c.urls, health_interval_s=0.1, kv_events={"enabled": False},
                            coalesce={"enabled": False})
        with start_router_in_thread(cfg) as h, httpx.Client(timeout=60) as client:
            # the workers' KV capacity (from /v1/loads) caps each one's share of the predicted index
            assert wait_for(lambda: all(h.router.index.capacity(u) for u in c.urls), 20)
            normal = [f"tenant {i}: " + _text(rng, 1_500) for i in range(16)]
            for t in normal:
                r = client.post(h.url + "/generate", json={"text": t, "sampling_params": {"max_new_tokens": 2}})
                assert r.status_code == 200, r.text
            assert _held(h, normal) == len(normal)
            cap = min(h.router.index.capacity(u) for u in c.urls)
            # over anchor_max_chars (256 KiB) and over every worker's whole predicted capacity
            huge = _text(rng, max(300_000, 2 * cap * h.router.index.block_chars))
            r = client.post(h.url + "/generate", json={"text": huge, "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 400, r.text
            with client.stream("POST", h.url + "/generate", json={"text": "x" + huge, "stream": True,
                                                                  "sampling_params": {"max_new_tokens": 2}}) as s:
                # SGLang streams a rejection as a 200 whose one event is the error
                assert s.status_code == 200 and b'"code":400' in s.read()
            assert _held(h, normal) == len(normal)  # was about half: the rejected prompt's worker wiped
            assert _held(h, [huge, "x" + huge]) == 0
            # over a quarter of a worker's capacity, within its context: predicted once answered
            long = _text(rng, cap * h.router.index.block_chars // 4 + 2_000)
            r = client.post(h.url + "/generate", json={"text": long, "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200, r.text
            assert _held(h, [long]) == 1
    finally:
        c.stop()
