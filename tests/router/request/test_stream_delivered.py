"""A stream whose `data: [DONE]` reached the client is a success even when the client closes before the
chunked terminator (the OpenAI SDK and `inferctl bench` close on [DONE]); a close before [DONE] is a 499.
Real: the router, its relay and metrics; the worker is a stand-in that holds its
response open after [DONE] (the gap in which such a client closes)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web

from infer_ctl.router.daemon.embed import router_config, start_router_in_thread


def _app() -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"text": "a", "meta_info": {"completion_tokens": 1}}\n\n')
        await asyncio.sleep(0.2)
        await resp.write(b'data: {"text": "ab", "meta_info": {"completion_tokens": 2, "prompt_tokens": 2}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(1.0)  # the terminator comes late: the client has closed by then
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    a = web.Application()
    a.router.add_post("/generate", generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        a.router.add_get(path, ok)
    return a


@pytest.fixture(scope="module")
def worker() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(_app())

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    yield asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _read_until_and_close(url: str, marker: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    body = b'{"text": "x", "stream": true}'
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        got = b""
        while marker not in got:
            data = s.recv(65536)
            assert data, got
            got += data
    return got


def _count(url: str, status: int) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(f'inferctl_router_requests_total{{endpoint="/generate",status="{status}"}}'):
            return float(line.split()[-1])
    return 0.0


def _wait_count(url: str, status: int, want: float) -> float:
    deadline = time.monotonic() + 5
    while (got := _count(url, status)) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_a_close_after_done_is_a_success_and_a_close_before_it_a_499(worker: str) -> None:
    with start_router_in_thread(router_config(workers=[worker], health_interval_s=60)) as router:
        got = _read_until_and_close(router.url, b"data: [DONE]")
        assert b"0\r\n\r\n" not in got  # the client closed before the terminator
        assert _wait_count(router.url, 200, 1) == 1
        assert _count(router.url, 499) == 0
        _read_until_and_close(router.url, b'"text": "a"')  # closed mid-stream: the client's own cancel
        assert _wait_count(router.url, 499, 1) == 1
        assert _count(router.url, 200) == 1
