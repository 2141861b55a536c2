"""The router's own error answers, each with its exact status and JSON body: every attempt failed (502),
queued too long (429), request timeout (504), the 500 safety net.

What is real: the router, its HTTP server and upstream client, TCP on loopback. What is scripted: the
workers (tiny aiohttp apps that pass health checks and then, on /generate, drop the connection, answer
an empty 502 or hang). The 500 needs a bug, which the router does not have on purpose: the test plants
one in the routing step of the running router."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.aio import new_event_loop
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from tests.router.pd.test_faults import wait_for


def error_doc(status: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


def standin(behaviour: str) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        if behaviour == "drop":  # a worker process that dies mid-request: the connection closes, no answer
            assert request.transport is not None
            request.transport.close()
            await asyncio.sleep(1)
        if behaviour == "empty_502":  # e.g. a proxy in front of the worker with nothing to say
            return web.Response(status=502)
        if behaviour == "hang":
            await asyncio.sleep(30)
        return web.json_response({"text": "ok", "meta_info": {"prompt_tokens": 3, "cached_tokens": 0}})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        app.router.add_get(path, ok)
    return app


@pytest.fixture(scope="module")
def workers() -> Iterator[dict[str, str]]:
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # the dropped connections' tracebacks
    loop = new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runners: list[web.AppRunner] = []

    async def start(behaviour: str) -> str:
        runner = web.AppRunner(standin(behaviour), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    out = {b: asyncio.run_coroutine_threadsafe(start(b), loop).result(10) for b in ("ok", "drop", "empty_502", "hang")}
    yield out

    async def stop() -> None:
        for r in runners:
            await r.cleanup()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


def metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10).text


def test_every_attempt_failing_on_the_transport_is_a_502_naming_the_last_error(workers: Any) -> None:
    url = workers["drop"]
    port = url.rsplit(":", 1)[1]
    cfg = router_config(workers=[url], health_interval_s=60, max_retries=2, cb_failures=100)
    with start_router_in_thread(cfg) as router:
        r = httpx.post(router.url + "/generate", json={"text": "x"}, headers={"X-Request-Id": "req-502"}, timeout=10)
        assert r.status_code == 502 and r.headers["x-request-id"] == "req-502"
        assert r.json() == error_doc(
            502, f"all 3 attempts failed; last: connection to 127.0.0.1:{port} lost: closed by peer", "server_error")
        text = metrics(router.url)
        assert 'inferctl_router_retries_total{cause="worker_error"} 2.0' in text
        assert 'inferctl_router_retries_total{cause="exhausted"} 1.0' in text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="502"} 1.0' in text


def test_retryable_answers_without_a_body_end_in_the_routers_own_502(workers: Any) -> None:
    url = workers["empty_502"]
    cfg = router_config(workers=[url], health_interval_s=60, max_retries=1, cb_failures=100)
    with start_router_in_thread(cfg) as router:
        r = httpx.post(router.url + "/generate", json={"text": "x"}, timeout=10)
        assert r.status_code == 502
        assert r.json() == error_doc(502, "all 2 attempts failed; last: HTTP 502", "server_error")


def test_a_request_queued_past_queue_timeout_is_a_429_and_the_running_one_a_504(workers: Any) -> None:
    url = workers["hang"]
    cfg = router_config(workers=[url], health_interval_s=60, max_concurrent=1, max_queue=1, queue_timeout_s=0.2,
                        request_timeout_s=2.0)
    with start_router_in_thread(cfg) as router, ThreadPoolExecutor(1) as pool:
        first = pool.submit(httpx.post, router.url + "/generate", json={"text": "holds the only slot"}, timeout=10)
        assert wait_for(lambda: router.router.active == 1)
        t = time.monotonic()
        r = httpx.post(router.url + "/generate", json={"text": "waits"}, timeout=10)
        assert r.status_code == 429 and time.monotonic() - t < 1.5  # well before the running one ends
        assert r.json() == error_doc(429, "queued too long waiting for a slot; retry later", "rate_limit_error")
        assert router.router.waiting == 0
        held = first.result()
        assert held.status_code == 504
        assert held.json() == error_doc(504, "no response within 2s", "server_error")
        text = metrics(router.url)
        assert 'inferctl_router_rejected_total{reason="queue_timeout"} 1.0' in text
        assert 'inferctl_router_rejected_total{reason="timeout"} 1.0' in text


def test_a_bug_in_the_request_path_is_a_json_500_and_the_router_keeps_serving(
        workers: Any, caplog: pytest.LogCaptureFixture) -> None:
    url = workers["ok"]
    with start_router_in_thread(router_config(workers=[url], health_interval_s=60)) as router:
        picker = router.router.picker

        def planted_bug(ctx: Any, excluded: set[str]) -> Any:
            raise RuntimeError("planted routing bug")

        picker.pick = planted_bug  # an instance attribute: shadows the method for this router only
        with caplog.at_level(logging.ERROR, logger="infer_ctl.router"):
            r = httpx.post(router.url + "/generate", json={"text": "x"}, headers={"X-Request-Id": "req-500"},
                           timeout=10)
        assert r.status_code == 500 and r.headers["x-request-id"] == "req-500"
        assert r.json() == error_doc(500, "internal router error; see the router's log", "server_error")
        logged = [rec for rec in caplog.records if rec.getMessage() == "internal error"]
        assert logged and logged[0].exc_info is not None and "planted routing bug" in str(logged[0].exc_info[1])
        assert router.router.active == 0  # its slot was given back
        assert 'inferctl_router_requests_total{endpoint="/generate",status="500"} 1.0' in metrics(router.url)
        del picker.pick  # the bug removed: the same router answers again
        assert httpx.post(router.url + "/generate", json={"text": "x"}, timeout=10).status_code == 200
