"""The pending overlay (router/request/coalesce.py) against what a worker's KV events report, on real loopback
workers (the simulator, KV events on) and the real router.

A landed prompt leaves the overlay once its worker's KV events cover it (the exact index holds it, or
the worker's cache was cleared), not when its request ends: from then on the exact index says what the
worker holds, and what it drops afterwards too. The stale benchmark (docs/benchmarks.md, random direct
traffic) measured the difference: a session's next turn, sent the moment its previous turn ended, was
routed on that turn's overlay to the worker that had just evicted it (0 cached), past a worker that
held its system prompt. Nor at simply the worker's next batch: that one may hold other requests' blocks
only (SGLang publishes a step's stores later), and the prompt then counted as held nowhere."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
from types import SimpleNamespace
from typing import Any

import httpx

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.router.request.attempt import landed
from infer_ctl.router.request.coalesce import Coalescer
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.router.conftest import new_coalesce_config
from tests.sim.kv_client import kv_config
from tests.waiting import wait_for


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(3)) for _ in range(n))


def generate(url: str, text: str, max_new_tokens: int = 1) -> dict[str, Any]:
    """A streamed /generate; the last event's meta_info."""
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", url + "/generate", json=body) as s:
        assert s.status_code == 200
        events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: {")]
    return dict(json.loads(events[-1])["meta_info"])


def requests_on(url: str) -> int:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("sglang:num_requests_total"):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def test_a_prompt_its_worker_evicted_after_landing_does_not_pull_the_next_turn_there() -> None:
    # 1,500 tokens a worker: one prompt of 700 tokens and two fillers of 900 cannot all stay. The sim
    # unlocks a prompt after its prefill, so the fillers evict it while its request still decodes
    spec: dict[str, Any] = {"time_scale": 1.0, "speculative": False, "cache_capacity_tokens": 1500}
    cluster = start_cluster_in_thread([WorkerSpec("mixed", kv_events_config=kv_config(), **spec) for _ in range(2)])
    router: RouterHandle | None = None
    try:
        router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=0.3))
        assert wait_for(lambda: all(w["index"] == "exact" for w in httpx.get(
            router.url + "/admin/workers", timeout=5).json()["workers"]), timeout=15)
        rng = random.Random(3)
        system = "tenant " + words(rng, 600)
        turn = f"{system}\n\nsession1 user {words(rng, 100)}"

        # turn 1 through the router, decoding long enough for the rest of the setup
        first: dict[str, Any] = {}
        t = threading.Thread(target=lambda: first.update(generate(router.url, turn, max_new_tokens=150)))
        t.start()
        assert wait_for(lambda: sum(requests_on(u) for u in cluster.urls) == 1, timeout=10)
        wa = next(u for u in cluster.urls if requests_on(u) == 1)
        wb = next(u for u in cluster.urls if u != wa)
        co = router.router.coalesce
        # past the router: the system prompt reaches the other worker, fillers evict turn 1 from its own
        generate(wb, system + "\n\ndirect")
        for _ in range(2):
            generate(wa, "filler " + words(rng, 900))
        # the router's exact index has seen both: wa holds nothing of the prompt, wb its system part
        hashes = router.router.index.hashes(turn)

        async def held() -> dict[str, int]:
            return dict(router.router.kv.cached(hashes, turn, [wa, wb])[0])

        assert wait_for(lambda: (c := router.call(held()))[wa] == 0 and c[wb] >= 550, timeout=10), router.call(held())
        assert t.is_alive()  # still decoding: the setup happened while turn 1 was in flight
        t.join(30)
        assert first, "turn 1 failed"
        assert first["cached_tokens"] == 0

        # turn 2, sent as turn 1 ended: wa has been idle since its fillers (no KV batch from it since).
        # Kept pending until wa's next batch after the end (up to 1 s), turn 1's chain outweighed wb's
        # system prompt (the whole turn 1 against its first 600 tokens) and turn 2 went to wa: 0 cached
        second = generate(router.url, f"{turn}\n\nassistant {words(rng, 20)}\n\nsession1 user {words(rng, 30)}")
        assert second["cached_tokens"] >= 0.9 * 600, (second, co.pending.snapshot())
    finally:
        if router is not None:
            router.stop()
        cluster.stop()


def test_a_landed_flight_leaves_the_overlay_at_its_workers_next_batch_while_its_request_runs() -> None:
    async def main() -> None:
        co = Coalescer(new_coalesce_config(grace_s=60.0), block_chars=64, chars_per_token=lambda: 4.0, max_retries=0)
        ctx: Any = SimpleNamespace(hashes=[11, 12, 13], exact=True, held_tokens=0, predicted_chars=0, flight=None,
                                   on_landed=None)
        pre: Any = SimpleNamespace(url="http://w1")
        seen: dict[str, int] = {}

        async def attempt(ctx: Any, pre: Any, dec: Any) -> None:
            seen["computing"] = co.pending.blocks("http://w1")
            co.kv_batch("http://w1")  # a batch before the prompt landed: it still counts
            seen["batch before landing"] = co.pending.blocks("http://w1")
            landed(ctx)  # its first byte: the worker stored it and publishes the stores
            seen["landed"] = co.pending.blocks("http://w1")
            co.kv_batch("http://w1")  # from here on the worker's events say what it holds
            seen["batch after landing"] = co.pending.blocks("http://w1")

        await co.run(ctx, pre, None, attempt)
        assert seen == {"computing": 3, "batch before landing": 3, "landed": 3, "batch after landing": 0}
        assert not co.pending.snapshot() and not co.landings.landed

    asyncio.run(main())


class HeldStores:
    """Holds a simulated worker's KV-event batches back until `release`, but for the next `passing`
    ones, which go out as they come: as SGLang publishes a step's stores only with a later step's
    stats, a batch of another request's blocks arrives between a prompt's first byte and its stores.
    Only a batch that stores nothing under what is held may pass (SGLang's stream is in order)."""

    def __init__(self, worker: Any) -> None:
        self.rec = worker.kv_recorder
        self.publish = self.rec.sink
        self.held: list[Any] = []
        self.passing = 0
        self.rec.sink = self._sink

    def _sink(self, items: Any) -> None:
        if self.passing > 0:
            self.passing -= 1
            self.publish(items)
        else:
            self.held.append(items)

    def release(self, *, drop: bool = False) -> None:
        """Publish what was held, in order (`drop`: the worker cleared its cache since, nothing of it is left)."""
        self.rec.sink = self.publish
        for items in [] if drop else self.held:
            self.publish(items)
        self.held.clear()


def test_a_batch_of_other_blocks_before_a_landed_prompts_stores_keeps_it_pending() -> None:
    spec: dict[str, Any] = {"time_scale": 0.2, "speculative": False}
    cluster = start_cluster_in_thread([WorkerSpec("mixed", kv_events_config=kv_config(), **spec) for _ in range(2)])
    router: RouterHandle | None = None
    gates: list[HeldStores] = []
    try:
        router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=0.3))
        kv = router.router.kv
        assert wait_for(lambda: all(w["index"] == "exact" for w in httpx.get(
            router.url + "/admin/workers", timeout=5).json()["workers"]), timeout=15)
        co = router.router.coalesce
        # the grace (a worker without events) out of the way: only the events decide here
        co.cfg = dataclasses.replace(co.cfg, grace_s=60.0)
        rng = random.Random(5)
        system = "tenant " + words(rng, 250)
        turn = f"{system}\n\nsession1 user {words(rng, 700)}"

        # turn 1 through the router: it lands (its answer), its worker's batch with its stores held back
        gates = [HeldStores(w) for w in cluster.cluster.workers]
        first = generate(router.url, turn)
        wa = next(u for u in cluster.urls if requests_on(u) == 1)
        wb = next(u for u in cluster.urls if u != wa)
        ga = gates[cluster.urls.index(wa)]
        assert len(ga.held) == 1
        gates[cluster.urls.index(wb)].release()
        assert first["cached_tokens"] == 0

        def batches(url: str) -> int:
            return sum(s.stats.batches for s in kv.workers[url].streams)

        # past the router: wb gets the system prompt; wa another prompt, whose batch goes out before
        # turn 1's stores
        generate(wb, system + "\n\ndirect")
        n = batches(wa)
        ga.passing = 1
        generate(wa, "filler " + words(rng, 300))
        assert wait_for(lambda: batches(wa) > n, timeout=10)
        hashes = router.router.index.hashes(turn)

        async def held() -> dict[str, int]:
            return dict(kv.cached(hashes, turn, [wa, wb])[0])

        assert wait_for(lambda: (c := router.call(held()))[wa] == 0 and c[wb] >= 200, timeout=10), router.call(held())

        # turn 2: wa holds turn 1 (it computed it) though its events do not say so yet. Dropped from
        # the overlay at the filler's batch, turn 1 counted as held nowhere and turn 2 went to wb for
        # the system prompt alone
        second = generate(router.url, f"{turn}\n\nassistant {words(rng, 20)}\n\nsession1 user {words(rng, 30)}")
        assert requests_on(wa) == 3, (second, co.pending.snapshot())
        assert second["cached_tokens"] >= 0.9 * 950

        # the stores come (turn 1's, then turn 2's): both leave the overlay
        ga.release()
        assert wait_for(lambda: router.call(held())[wa] >= 900, timeout=10)
        assert wait_for(lambda: not co.landings.landed, timeout=10), co.landings.landed
        assert all(s.exact and not s.stats.rejected for s in kv.workers[wa].streams)  # in order all along
    finally:
        for g in gates:
            g.release()
        if router is not None:
            router.stop()
        cluster.stop()


def test_a_cleared_cache_after_landing_drops_a_landed_prompt_before_its_stores_came() -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", kv_events_config=kv_config(), time_scale=0.2,
                                                  speculative=False)])
    router: RouterHandle | None = None
    gate: HeldStores | None = None
    try:
        router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=0.3))
        assert wait_for(lambda: all(w["index"] == "exact" for w in httpx.get(
            router.url + "/admin/workers", timeout=5).json()["workers"]), timeout=15)
        co = router.router.coalesce
        co.cfg = dataclasses.replace(co.cfg, grace_s=60.0)
        gate = HeldStores(cluster.cluster.workers[0])
        generate(router.url, "tenant " + words(random.Random(7), 400))
        assert gate.held and co.pending.snapshot()  # landed, its stores held back: pending
        # the worker's cache is flushed: what it holds (nothing) is in its events from here on
        gate.passing = 1
        assert httpx.post(cluster.urls[0] + "/flush_cache", timeout=5).status_code == 200
        gate.release(drop=True)
        assert wait_for(lambda: not co.pending.snapshot() and not co.landings.landed, timeout=10), co.pending.snapshot()
    finally:
        if gate is not None:
            gate.release(drop=True)
        if router is not None:
            router.stop()
        cluster.stop()
