"""In-flight prefix coalescing through the real router (router/request/coalesce.py).

A burst of same-prefix requests on simulated workers: with coalescing, the first computes the prefix
and the others wait for it, then hit (1 miss + N-1 hits); without, every request of the burst computes
it (the simulator, like SGLang's default fcfs scheduling, matches a prefix when a request arrives).
The hold's edges with a scripted stand-in worker (the simulator cannot fail a request on demand): a
leader that errors or drops its connection releases its followers at once; max_wait_s bounds the
hold; a client that goes away while held frees its slot and never reaches the worker."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.sim.kv_client import kv_config
from tests.waiting import wait_for

WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health", "inference", "journal"]


def metric(router: RouterHandle, name: str) -> float:
    total = 0.0
    for line in httpx.get(router.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def meta(router: RouterHandle, body: dict[str, Any]) -> dict[str, Any]:
    """The answer's meta_info (the last event's when streamed)."""
    with httpx.Client(timeout=30) as c:
        if not body.get("stream"):
            r = c.post(router.url + "/generate", json=body)
            assert r.status_code == 200, r.text
            return dict(r.json()["meta_info"])
        with c.stream("POST", router.url + "/generate", json=body) as s:
            assert s.status_code == 200
            events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: {")]
        return dict(json.loads(events[-1])["meta_info"])


# ---- the burst on simulated workers --------------------------------------------------------------------
@pytest.mark.parametrize(("kv", "stream", "coalesce", "pd"),
                         [(True, True, True, False), (False, False, True, False), (True, True, False, False),
                          (True, True, True, True), (False, False, True, True)],
                         ids=["exact-stream", "predicted-unary", "off", "pd-exact-stream", "pd-predicted-unary"])

def test_a_burst_of_one_new_prefix_computes_it_once(kv: bool, stream: bool, coalesce: bool, pd: bool) -> None:
    # slow prefill (1.5 % MFU: about a second for the shared prompt at time scale 1), so the burst
    # arrives while the first request is still prefilling, however loaded the machine
    kw: dict[str, Any] = {"time_scale": 1.0, "speculative": False, "prefill_mfu": 0.015,
                          "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    roles = ["prefill", "prefill", "decode"] if pd else ["mixed", "mixed"]
    specs = [WorkerSpec(r, kv_events_config=kv_config() if kv and r != "decode" else None, **kw) for r in roles]
    cluster = start_cluster_in_thread(specs)
    workers = {"prefill": [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"],
               "decode": [w.url for w in cluster.workers if w.spec.role == "decode"]} if pd else {
               "workers": [w.url for w in cluster.workers]}
    router = start_router_in_thread(router_config(**workers, health_interval_s=0.3, warm_via="pair",
                                                  coalesce={"enabled": coalesce, "max_wait_s": 8.0}))
    try:
        if kv:
            assert wait_for(lambda: all(w["index"] == "exact" for w in httpx.get(
                router.url + "/admin/workers", timeout=5).json()["workers"] if w["role"] != "decode"))
        rng = random.Random(5)
        system = " ".join(rng.choice(WORDS) for _ in range(1000))
        n = 5

        def one(i: int) -> dict[str, Any]:
            body = {"text": f"{system} question {i}", "sampling_params": {"max_new_tokens": 1}, "stream": stream}
            return meta(router, body)

        with ThreadPoolExecutor(n) as pool:
            first = pool.submit(one, 0)  # the leader; the others once it is on a worker, computing
            assert wait_for(lambda: sum(w.load_inflight for w in router.router.workers.all()) >= 1, timeout=10)
            rest = pool.map(one, range(1, n))  # submitted now, collected below
            metas = [first.result(), *rest]
        prompt = min(m["prompt_tokens"] for m in metas)
        hits = sum(m["cached_tokens"] >= 0.9 * prompt for m in metas)
        if coalesce:
            assert hits == n - 1, metas
            assert metric(router, 'inferctl_router_coalesce_held_total{reason="landed"}') == n - 1
        else:  # the change's absence: the burst computes the prefix several times
            assert hits < n - 1, metas
            assert metric(router, "inferctl_router_coalesce_held_total") == 0
        if kv and coalesce and not pd:
            # an ended flight stays pending until its worker's next KV batch (its stores, or a
            # flush's AllBlocksCleared), not for the grace: the overlay never outlives what the worker holds
            co = router.router.coalesce
            co.cfg = dataclasses.replace(co.cfg, grace_s=60.0)
            one(n)
            for w in cluster.workers:
                assert httpx.post(w.url + "/flush_cache", timeout=10).status_code == 200
            assert wait_for(lambda: not co.pending.snapshot(), timeout=10), co.pending.snapshot()
    finally:
        router.stop()
        cluster.stop()


# ---- the hold's edges with a scripted stand-in worker ----------------------------------------------------
class StandIn:
    """One collocated worker whose first request (the leader) is scripted: `behaviour` error (HTTP 500
    after `stall_s`), drop (its connection closed after `stall_s`), stall (its first byte after
    `stall_s`). Every other request streams at once. Records when each request arrived."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.behaviour, self.stall_s = "stall", 1.0
        self.arrivals: list[tuple[float, str]] = []
        self.leader_done: float | None = None
        self.runner: web.AppRunner | None = None
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def reset(self, behaviour: str, stall_s: float) -> None:
        self.behaviour, self.stall_s, self.arrivals, self.leader_done = behaviour, stall_s, [], None

    async def _start(self) -> str:
        async def generate(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            leader = not self.arrivals
            self.arrivals.append((time.monotonic(), body["text"]))
            if leader:
                await asyncio.sleep(self.stall_s)
                self.leader_done = time.monotonic()
                if self.behaviour == "error":
                    return web.json_response({"error": "boom"}, status=500)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if leader and self.behaviour == "drop":  # the worker died mid-prefill: the stream ends empty
                request.transport.close()  # type: ignore[union-attr]
                return resp
            await resp.write(b'data: {"text": "a", "meta_info": {"prompt_tokens": 2000, "cached_tokens": 0}}\n\n')
            await resp.write(b"data: [DONE]\n\n")
            return resp

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/generate", generate)
        for path in ("/health", "/server_info", "/v1/loads"):
            app.router.add_get(path, ok)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    def close(self) -> None:
        assert self.runner is not None
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.close()


SYSTEM = "system " * 2000  # ~14,000 characters: far above min_tokens at any chars-per-token estimate


def send(router: RouterHandle, text: str, timeout: float = 30) -> int:
    with httpx.Client(timeout=timeout) as c, c.stream(
            "POST", router.url + "/generate", json={"text": text, "stream": True}) as s:
        for _ in s.iter_lines():
            pass
        return s.status_code


def burst(router: RouterHandle, standin: StandIn, followers: int) -> ThreadPoolExecutor:
    """The leader, then (once it reached the worker) `followers` requests sharing its prefix."""
    pool = ThreadPoolExecutor(followers + 1)
    pool.submit(send, router, SYSTEM + "leader")
    assert wait_for(lambda: standin.arrivals, timeout=10)
    for i in range(followers):
        pool.submit(send, router, SYSTEM + f"follower {i}")
    return pool


@pytest.fixture
def router(standin: StandIn) -> Iterator[RouterHandle]:
    handle = start_router_in_thread(router_config(workers=[standin.url], health_interval_s=60,
                                                  coalesce={"max_wait_s": 8.0}, retry_base_s=0.01))
    yield handle
    handle.stop()


@pytest.mark.parametrize("behaviour", ["error", "drop"])
def test_a_failing_leader_releases_its_followers_at_once(standin: StandIn, router: RouterHandle,
                                                         behaviour: str) -> None:
    standin.reset(behaviour, 1.5)
    pool = burst(router, standin, 3)
    assert wait_for(lambda: router.router.coalesce.holding == 3, timeout=10)
    assert len(standin.arrivals) == 1  # held: none reached the worker while the leader computes
    pool.shutdown(wait=True)
    assert standin.leader_done is not None
    follower_at = [t for t, text in standin.arrivals if "follower" in text]
    assert len(follower_at) == 3
    # released by the failure, not by max_wait_s (8 s): within a few seconds of it on a loaded machine
    assert all(standin.leader_done - 0.05 <= t <= standin.leader_done + 3.0 for t in follower_at)
    # the worker failed the leader: its followers are re-routed (a retry each; the only worker here is
    # tried again), not promoted one after another onto the worker that failed it
    assert metric(router, 'inferctl_router_coalesce_held_total{reason="rerouted"}') == 3
    assert metric(router, 'inferctl_router_coalesce_held_total{reason="promoted"}') == 0


def test_max_wait_bounds_the_hold(standin: StandIn) -> None:
    standin.reset("stall", 4.0)
    handle = start_router_in_thread(router_config(workers=[standin.url], health_interval_s=60,
                                                  coalesce={"max_wait_s": 0.5}))
    try:
        t0 = time.monotonic()
        pool = burst(handle, standin, 2)
        assert wait_for(lambda: len(standin.arrivals) == 3, timeout=10)
        follower_at = [t for t, text in standin.arrivals if "follower" in text]
        assert all(t - t0 < 3.0 for t in follower_at)  # before the leader's first byte (4 s)
        assert standin.leader_done is None
        assert metric(handle, 'inferctl_router_coalesce_held_total{reason="timeout"}') == 2
        pool.shutdown(wait=True)
    finally:
        handle.stop()


def test_a_client_gone_while_held_frees_its_slot(standin: StandIn, router: RouterHandle) -> None:
    standin.reset("stall", 3.0)
    pool = ThreadPoolExecutor(1)
    leader = pool.submit(send, router, SYSTEM + "leader")
    assert wait_for(lambda: standin.arrivals, timeout=10)
    w = router.router.workers.all()[0]
    with pytest.raises(httpx.ReadTimeout):
        send(router, SYSTEM + "follower gone", timeout=0.5)  # held, then the client gives up
    assert wait_for(lambda: router.router.active == 1 and router.router.coalesce.holding == 0, timeout=10)
    assert w.load_inflight == 1  # the leader only: the held request no longer counts on the worker
    assert wait_for(lambda: metric(router, 'inferctl_router_coalesce_held_total{reason="cancelled"}') == 1)
    assert leader.result(timeout=20) == 200
    assert [text for _, text in standin.arrivals] == [SYSTEM + "leader"]  # it never reached the worker
    pool.shutdown()
