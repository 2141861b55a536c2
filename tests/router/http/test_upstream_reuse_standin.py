"""Upstream keep-alive under streamed requests: a relayed stream read to its end gives its connection to
the worker back to the pool, so the next request reuses it (one connect per worker, not one per request:
the cache-pressure benchmark's clients open a connection per request, the router's side must not), while
a stream the client abandons still closes its upstream connection (which is how SGLang learns to abort).

Real: the router, its upstream client and SSE relay, TCP on loopback. Scripted: the workers (aiohttp
stand-ins that record which connection, by the router's source port, carried each request)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.router.daemon.embed import router_config, start_router_in_thread


def app(role: str, peers: list[int]) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        peers.append(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        if role == "prefill" or not body.get("stream"):
            return web.json_response({"text": "ab", "meta_info": {"prompt_tokens": 2, "cached_tokens": 0}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(3):
            await resp.write(b'data: {"text": "%d", "meta_info": {"prompt_tokens": 2, "cached_tokens": 0}}\n\n' % i)
            if body.get("slow"):
                await asyncio.sleep(0.3)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    a = web.Application()
    a.router.add_post("/generate", generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        a.router.add_get(path, ok)
    return a


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, tuple[str, list[int]]]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    async def start(role: str) -> tuple[str, list[int]]:
        peers: list[int] = []
        runner = web.AppRunner(app(role, peers))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", peers  # type: ignore[union-attr]

    urls = {n: asyncio.run_coroutine_threadsafe(start(n.rstrip("0123456789")), loop).result(10)
            for n in ("mixed1", "mixed2", "prefill", "decode")}
    yield urls
    for r in runners:
        asyncio.run_coroutine_threadsafe(r.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def streamed(url: str, **extra: Any) -> list[str]:
    # a fresh client connection per request, as the cache-pressure benchmark's load generator opens
    with httpx.Client(timeout=20) as client, client.stream(
            "POST", url + "/generate", json={"text": "x", "stream": True, **extra}) as r:
        assert r.status_code == 200
        return [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]


def test_a_stream_read_to_its_end_leaves_its_upstream_connection_to_the_next_request(upstreams: Any) -> None:
    url, peers = upstreams["mixed1"]
    with start_router_in_thread(router_config(workers=[url], health_interval_s=60)) as router:
        for _ in range(5):
            assert streamed(router.url)[-1] == "[DONE]"
        httpx.post(router.url + "/generate", json={"text": "x"}, timeout=20).raise_for_status()
    # without the pool taking a finished stream's connection back: five connections for five streams
    assert len(peers) == 6 and len(set(peers)) == 1, peers


def test_pd_streams_reuse_both_upstream_connections(upstreams: Any) -> None:
    (pre, pre_peers), (dec, dec_peers) = upstreams["prefill"], upstreams["decode"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec], health_interval_s=60)) as router:
        for _ in range(4):
            assert streamed(router.url)[-1] == "[DONE]"
        deadline = time.monotonic() + 5  # the prefill's answer is read after the stream's: wait for the last
        while len(pre_peers) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(dec_peers) == 4 and len(set(dec_peers)) == 1, dec_peers
    assert len(pre_peers) == 4 and len(set(pre_peers)) == 1, pre_peers


def test_a_stream_the_client_abandons_still_closes_its_upstream_connection(upstreams: Any) -> None:
    url, peers = upstreams["mixed2"]
    with start_router_in_thread(router_config(workers=[url], health_interval_s=60)) as router:
        with httpx.Client(timeout=20) as client, client.stream(
                "POST", router.url + "/generate", json={"text": "x", "stream": True, "slow": True}) as r:
            assert next(r.iter_lines()).startswith("data: ")  # first event, then the client goes away
        time.sleep(0.3)
        assert streamed(router.url)[-1] == "[DONE]"
    # the abandoned stream's connection was closed, not pooled half-read: the next request made a new one
    assert len(peers) == 2 and peers[0] != peers[1], peers
