"""In-flight prefix coalescing (router/request/coalesce.py) when the leader or its worker misbehaves:
what a hold does to a request, on real routers and real loopback workers (the simulator,
or a scripted aiohttp stand-in where the simulator cannot misbehave on demand)."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from aiohttp import web

from infer_ctl.core.routing.index import BLOCK_CHARS
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.sim.kv_client import kv_config
from tests.waiting import wait_for

WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health", "inference", "journal"]
SYSTEM = "system " * 2000  # ~14,000 characters: far above min_tokens at any chars-per-token estimate


class Hangable:
    """A collocated stand-in: /generate answers a one-event stream at once, or, while `hung`, holds
    every request until the test ends (a hung worker), or, while `dead`, drops the connection of every
    new request (a crashed worker; the requests it holds stay held); a request whose text contains
    `bad` (when set) is answered 400 once it may go; /health answers 503 while `sick`.
    `arrivals`: each request's text, `arrived_at`: when it came (time.monotonic)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.hung = False
        self.sick = False
        self.dead = False
        self.bad = ""
        self.arrivals: list[str] = []
        self.arrived_at: list[float] = []
        self.runner: web.AppRunner | None = None
        self.release: asyncio.Event | None = None
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> str:
        self.release = asyncio.Event()

        async def generate(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.arrivals.append(body["text"])
            self.arrived_at.append(time.monotonic())
            assert self.release is not None
            if self.dead:
                assert request.transport is not None
                request.transport.close()
                await self.release.wait()  # nothing to write to
            if self.hung:
                await self.release.wait()
            if self.bad and self.bad in body["text"]:
                return web.json_response({"error": {"message": "bad request"}}, status=400)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"text": "a", "meta_info": {"prompt_tokens": 2000, "cached_tokens": 0}}\n\n')
            await resp.write(b"data: [DONE]\n\n")
            return resp

        async def health(request: web.Request) -> web.Response:
            return web.json_response({}, status=503 if self.sick else 200)

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({})

        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/generate", generate)
        app.router.add_get("/health", health)
        for path in ("/server_info", "/v1/loads"):
            app.router.add_get(path, ok)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    def close(self) -> None:
        assert self.runner is not None and self.release is not None
        self.loop.call_soon_threadsafe(self.release.set)
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def send(router: RouterHandle, text: str, timeout: float = 30) -> int:
    with httpx.Client(timeout=timeout) as c, c.stream(
            "POST", router.url + "/generate", json={"text": text, "stream": True}) as s:
        for _ in s.iter_lines():
            pass
        return s.status_code


def coalescer_is_empty(router: RouterHandle) -> bool:
    co = router.router.coalesce
    return (not co.pending.snapshot() and not co.holds.waited and not co.holds.futures and not co.landings.landed and not co.holds.queue
            and co.holding == 0)


# ---- F1: a hold outlives its worker --------------------------------------------------------------------
@pytest.mark.parametrize("how", ["unhealthy", "removed"])
def test_followers_held_on_a_worker_that_goes_away_are_not_sent_to_it(how: str) -> None:
    """A hung worker W: its leader never answers, the followers are held on W. The health check marks W
    unhealthy (or an operator removes it) and closes W's connections: the leader fails and is retried
    on the other worker. The followers must not then be dispatched to W - without coalescing they
    were on W already and the same connection drop sent them elsewhere; held, they are sent after the
    drop and hang on W until the request timeout."""
    a, b = Hangable(), Hangable()
    a.hung = b.hung = True  # whichever the leader lands on is the hung one
    router = start_router_in_thread(router_config(workers=[a.url, b.url], health_interval_s=0.2,
                                                  health_failures=2, coalesce={"max_wait_s": 8.0},
                                                  retry_base_s=0.01, request_timeout_s=60.0))
    pool = ThreadPoolExecutor(4)
    try:
        leader = pool.submit(send, router, SYSTEM + "leader", 20)
        assert wait_for(lambda: a.arrivals or b.arrivals, timeout=10)
        w, other = (a, b) if a.arrivals else (b, a)
        other.hung = False
        followers = [pool.submit(send, router, SYSTEM + f"follower {i}", 10) for i in range(3)]
        assert wait_for(lambda: router.router.coalesce.holding == 3, timeout=10), router.router.coalesce.status_doc()
        if how == "unhealthy":
            w.sick = True
        else:
            r = httpx.post(router.url + "/admin/workers/remove", json={"url": w.url}, timeout=10)
            assert r.status_code == 200, r.text
        assert leader.result(timeout=20) == 200  # retried on the other worker
        statuses = [f.result(timeout=20) for f in followers]  # a follower sent to the hung W: ReadTimeout
        assert statuses == [200, 200, 200]
        assert [t for t in w.arrivals if "follower" in t] == []
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)
        a.close()
        b.close()


# ---- F2: a non-streaming leader without KV events is waited for through its whole decode -----------------
@pytest.mark.parametrize("kv", [False, True], ids=["predicted", "exact"])
def test_a_follower_is_not_held_through_a_non_streaming_leaders_decode(kv: bool) -> None:
    """The landing signal without KV events is the leader's first byte; a non-streaming leader's first
    byte is its whole answer, so a follower waits through the leader's decode (600 tokens here, several
    seconds) for a prefix that was cached a prefill (about a second) after the leader started: the
    follower is answered after the leader although it asked for one token. With KV events the
    worker's stores land the leader at its prefill's end (the control case)."""
    kw: dict[str, Any] = {"time_scale": 1.0, "speculative": False, "prefill_mfu": 0.015}
    cluster = start_cluster_in_thread([WorkerSpec("mixed", kv_events_config=kv_config() if kv else None, **kw)])
    router = start_router_in_thread(router_config(workers=[w.url for w in cluster.workers],
                                                  health_interval_s=0.3, coalesce={"max_wait_s": 8.0}))
    pool = ThreadPoolExecutor(2)
    try:
        if kv:
            assert wait_for(lambda: all(w["index"] == "exact" for w in httpx.get(
                router.url + "/admin/workers", timeout=5).json()["workers"]))
        rng = random.Random(5)
        system = " ".join(rng.choice(WORDS) for _ in range(1000))
        done: dict[str, float] = {}

        def one(name: str, body: dict[str, Any]) -> None:
            r = httpx.post(router.url + "/generate", json=body, timeout=30)
            assert r.status_code == 200, r.text
            done[name] = time.monotonic()

        leader = pool.submit(one, "leader", {"text": f"{system} question leader",
                                             "sampling_params": {"max_new_tokens": 600}})
        assert wait_for(lambda: router.router.workers.all()[0].load_inflight >= 1, timeout=10)
        follower = pool.submit(one, "follower", {"text": f"{system} question follower",
                                                 "sampling_params": {"max_new_tokens": 1}})
        leader.result(timeout=30)
        follower.result(timeout=30)
        # the leader's decode is ~4 s after its ~1 s prefill; a follower held only for the prefill is
        # done seconds before the leader, one held through the decode a few ms after it
        assert done["leader"] - done["follower"] > 1.5, done
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)
        cluster.stop()


# ---- F3: a failed leader's followers all computed the prefix (one is promoted now) ------------------------
def raw_stream_request(url: str, body: dict[str, Any]) -> socket.socket:
    """A streaming request on a plain socket, left open: closing it is the client going away."""
    u = urlsplit(url)
    data = json.dumps(body).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=10)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_a_leaders_client_gone_mid_prefill_leaves_one_follower_to_compute() -> None:
    """The leader's user closes the tab while it prefills a new prefix with 3 followers held. Every
    follower was released at once and all 3 computed the prefix together (the burst coalescing exists
    for); one of them becomes the leader (promoted) and the other two wait for it."""
    kw: dict[str, Any] = {"time_scale": 1.0, "speculative": False, "prefill_mfu": 0.008}
    cluster = start_cluster_in_thread([WorkerSpec("mixed", **kw)])
    router = start_router_in_thread(router_config(workers=[w.url for w in cluster.workers],
                                                  health_interval_s=0.3, coalesce={"max_wait_s": 8.0}))
    pool = ThreadPoolExecutor(3)
    try:
        rng = random.Random(5)
        system = " ".join(rng.choice(WORDS) for _ in range(1000))
        sock = raw_stream_request(router.url, {"text": f"{system} question leader", "stream": True,
                                               "sampling_params": {"max_new_tokens": 1}})

        def one(i: int) -> dict[str, Any]:
            r = httpx.post(router.url + "/generate", json={"text": f"{system} question {i}",
                                                           "sampling_params": {"max_new_tokens": 1}}, timeout=30)
            assert r.status_code == 200, r.text
            return dict(r.json()["meta_info"])

        assert wait_for(lambda: router.router.workers.all()[0].load_inflight >= 1, timeout=10)
        futs = [pool.submit(one, i) for i in range(3)]
        assert wait_for(lambda: router.router.coalesce.holding == 3, timeout=10)
        sock.close()  # the leader's client goes away mid-prefill
        metas = [f.result(timeout=30) for f in futs]
        hits = sum(m["cached_tokens"] >= 0.9 * m["prompt_tokens"] for m in metas)
        assert hits == 2, metas
        co = router.router.coalesce
        assert co.status_doc()["promoted"] == 1 and co.status_doc()["rerouted"] == 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)
        cluster.stop()


# ---- guard: nothing is left behind ------------------------------------------------------------------------
@pytest.fixture
def hangable() -> Iterator[Hangable]:
    h = Hangable()
    yield h
    h.close()


def test_nothing_is_left_in_the_coalescer_after_held_traffic(hangable: Hangable) -> None:
    """Held requests whose leader lands, whose client goes away, and a burst timed out by max_wait:
    once the traffic stops the overlay, the waited-for leaders, their futures and the ended flights
    are all empty again (no per-request growth on the hot path)."""
    router = start_router_in_thread(router_config(workers=[hangable.url], health_interval_s=60,
                                                  coalesce={"max_wait_s": 0.5}, retry_base_s=0.01))
    pool = ThreadPoolExecutor(8)
    try:
        for round_ in range(3):
            system = f"system{round_} " * 2000  # a new prefix each round: nobody holds it yet
            hangable.hung = True
            n = len(hangable.arrivals)
            leader = pool.submit(send, router, system + "leader", 20)
            assert wait_for(lambda n=n: len(hangable.arrivals) > n, timeout=10)
            hangable.hung = False
            followers = [pool.submit(send, router, system + f"follower {i}", 20) for i in range(3)]
            with pytest.raises(httpx.ReadTimeout):
                send(router, system + "gone", timeout=0.2)  # held, then its client gives up
            assert all(f.result(timeout=20) == 200 for f in followers)  # after max_wait_s
            hangable.loop.call_soon_threadsafe(hangable.release.set)  # type: ignore[union-attr]
            assert leader.result(timeout=20) == 200
            hangable.release = asyncio.Event()
        assert wait_for(lambda: router.router.active == 0, timeout=10)
        assert wait_for(lambda: coalescer_is_empty(router), timeout=10), router.router.coalesce.status_doc()
        assert router.router.workers.all()[0].load_inflight == 0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)


# ---- guard: a drain waits for the held requests and drops none ---------------------------------------------
def test_stop_while_requests_are_held_answers_them_and_returns(hangable: Hangable) -> None:
    """`router.stop()` (drain) with three followers held on a leader that is still computing: new
    requests are refused, the held ones go on once the leader answers, every one is answered, and the
    stop returns (it does not wait for drain_timeout_s)."""
    router = start_router_in_thread(router_config(workers=[hangable.url], health_interval_s=60,
                                                  coalesce={"max_wait_s": 8.0}, drain_timeout_s=12.0))
    pool = ThreadPoolExecutor(5)
    try:
        hangable.hung = True
        leader = pool.submit(send, router, SYSTEM + "leader", 20)
        assert wait_for(lambda: hangable.arrivals, timeout=10)
        hangable.hung = False
        followers = [pool.submit(send, router, SYSTEM + f"follower {i}", 20) for i in range(3)]
        assert wait_for(lambda: router.router.coalesce.holding == 3, timeout=10)
        t0 = time.monotonic()
        stopping = pool.submit(router.stop)
        assert wait_for(lambda: router.router.draining, timeout=5)
        hangable.loop.call_soon_threadsafe(hangable.release.set)  # type: ignore[union-attr]
        assert leader.result(timeout=20) == 200
        assert [f.result(timeout=20) for f in followers] == [200, 200, 200]
        stopping.result(timeout=20)
        assert time.monotonic() - t0 < 10.0
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)


# ---- F4: the overlay is bounded ----------------------------------------------------------------------------
def test_a_huge_prompt_puts_a_bounded_number_of_blocks_in_the_overlay(hangable: Hangable) -> None:
    """A 4 MB prompt (max_body_bytes allows 32 MiB): its whole chain went into the pending overlay,
    62,500 blocks (a 30 MB one: 470,000 blocks, 43 MB, about a second of the router's event loop to
    add and remove, every other request stalled meanwhile). The overlay keeps at most a long
    context's worth (core/routing/index.py block hashes of 512 KiB of routing text)."""
    router = start_router_in_thread(router_config(workers=[hangable.url], health_interval_s=60))
    pool = ThreadPoolExecutor(1)
    try:
        hangable.hung = True
        huge = "You are a helpful assistant. " * (4_000_000 // 29)
        fut = pool.submit(send, router, huge, 30)
        assert wait_for(lambda: hangable.arrivals, timeout=20)
        co = router.router.coalesce
        blocks = co.pending.blocks(hangable.url)
        assert 0 < blocks * BLOCK_CHARS <= 1 << 20, blocks
        hangable.loop.call_soon_threadsafe(hangable.release.set)  # type: ignore[union-attr]
        assert fut.result(timeout=20) == 200
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)


# ---- found on the way (main too): a dropped worker's reused connection was re-sent to it -----------------
def test_a_request_on_a_reused_connection_is_not_resent_to_a_worker_gone_unhealthy() -> None:
    """Going unhealthy closes the worker's connections so that requests stuck on it are retried
    elsewhere (router/control/health.py). A request on a reused keep-alive connection took that close for a
    worker that had closed an idle connection and sent itself again, on a fresh connection, to the same
    hung worker (router/http/upstream.py `Pool.request`): it hung until the request timeout. No coalescing."""
    a, b = Hangable(), Hangable()
    router = start_router_in_thread(router_config(workers=[a.url, b.url], policy="round_robin",
                                                  coalesce={"enabled": False}, health_interval_s=0.2,
                                                  health_failures=2, retry_base_s=0.01,
                                                  request_timeout_s=60.0))
    pool = ThreadPoolExecutor(1)
    try:
        for i in range(2):  # one on each worker: each pool keeps an idle keep-alive connection
            assert send(router, f"warm {i}") == 200
        assert len(a.arrivals) == len(b.arrivals) == 1
        a.hung = b.hung = True
        stuck = pool.submit(send, router, "stuck", 10)
        assert wait_for(lambda: len(a.arrivals) + len(b.arrivals) == 3, timeout=10)
        w, other = (a, b) if len(a.arrivals) == 2 else (b, a)
        other.hung = False
        w.sick = True
        assert stuck.result(timeout=20) == 200  # retried on the other worker, not re-sent to the hung one
        assert w.arrivals.count("stuck") == 1
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        router.stop(drain=False)
        a.close()
        b.close()
