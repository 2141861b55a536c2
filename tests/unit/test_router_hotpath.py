"""The router's non-streaming PD hot path (router/request/attempt.py `unary`, `payload`) against scripted stand-in
upstreams (tiny aiohttp apps on loopback, not SGLang: they answer at once, fail or hang on purpose).

What is real: the router, its HTTP server and upstream client, TCP on loopback. What is scripted: the
workers' answers. Checked: a prefill that fails while the decode waits ends the attempt at once (4xx
passed through, 5xx retried), the bootstrap fields are spliced into the client's body byte-exactly (and
the body is re-serialised when the client sent PD fields itself), batches get lists."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.aio import new_event_loop
from infer_ctl.errors import UsageError
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread


def standin(behaviour: str, seen: list[bytes]) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.read()
        seen.append(body)
        if behaviour == "prefill_400":
            return web.json_response({"error": {"message": "bad sampling params"}}, status=400)
        if behaviour == "prefill_503":
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        if behaviour.startswith("hang"):
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
def upstreams() -> Iterator[dict[str, tuple[str, list[bytes]]]]:
    loop = new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    runners: list[web.AppRunner] = []

    async def start(behaviour: str) -> tuple[str, list[bytes]]:
        seen: list[bytes] = []
        runner = web.AppRunner(standin(behaviour, seen), handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", seen  # type: ignore[union-attr]

    out = {b: asyncio.run_coroutine_threadsafe(start(b), loop).result(10)
           for b in ("ok_prefill", "ok_decode", "prefill_400", "prefill_503", "hang", "hang2")}
    yield out

    async def stop() -> None:
        for r in runners:
            await r.cleanup()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


def test_prefill_client_error_is_passed_on_without_waiting_for_the_decode(upstreams: Any) -> None:
    pre, _ = upstreams["prefill_400"]
    dec, _ = upstreams["hang"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec], health_interval_s=60)) as router:
        t = time.monotonic()
        r = httpx.post(router.url + "/generate", json={"text": "x"}, timeout=10)
        assert r.status_code == 400 and "bad sampling" in r.text
        assert time.monotonic() - t < 2.0
        assert router.router.active == 0


def test_prefill_server_error_is_retried_then_reported(upstreams: Any) -> None:
    pre, seen = upstreams["prefill_503"]
    dec, _ = upstreams["hang"]
    before = len(seen)
    cfg = router_config(prefill=[(pre, 1)], decode=[dec], health_interval_s=60, max_retries=2, cb_failures=100)
    with start_router_in_thread(cfg) as router:
        t = time.monotonic()
        r = httpx.post(router.url + "/generate", json={"text": "x"}, timeout=10)
        # every attempt failed on a worker 5xx: the router's own 502 JSON, naming the 503
        assert r.status_code == 502 and time.monotonic() - t < 3.0
        assert r.json()["error"]["type"] == "server_error" and "HTTP 503" in r.json()["error"]["message"]
        assert len(seen) - before == 3  # one try and two retries
        metrics = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_retries_total{cause="prefill_status"} 2.0' in metrics


def test_request_timeout_still_wins_over_a_hanging_pair(upstreams: Any) -> None:
    hang, _ = upstreams["hang"]
    hang2, _ = upstreams["hang2"]
    cfg = router_config(prefill=[(hang, 1)], decode=[hang2], health_interval_s=60, request_timeout_s=0.5)
    with start_router_in_thread(cfg) as router:
        r = httpx.post(router.url + "/generate", json={"text": "x"}, timeout=10)
        assert r.status_code == 504 and r.json()["error"]["type"] == "server_error"
        # the connection's task still serves the next request (no stray cancellation left behind)
        with httpx.Client(timeout=10) as c:
            assert c.post(router.url + "/generate", json={"text": "y"}).status_code == 504
            assert c.get(router.url + "/health").status_code == 200


@pytest.mark.parametrize("raw", [
    b'{"text": "Say hi.", "sampling_params": {"max_new_tokens": 1}}',
    b'  {"text":"a}"}\n\n',
    b"{}",
    b'{"text": ["a", "b", "c"]}',
    b'{"input_ids": [[1, 2], [3]], "stream": false}',
    b'{"text": "x", "bootstrap_room": 0, "bootstrap_host": "evil"}',
])
def test_bootstrap_fields_are_added_to_the_clients_body(upstreams: Any, raw: bytes) -> None:
    pre, pre_seen = upstreams["ok_prefill"]
    dec, dec_seen = upstreams["ok_decode"]
    with start_router_in_thread(router_config(prefill=[(pre, 8998)], decode=[dec], health_interval_s=60)) as router:
        r = httpx.post(router.url + "/generate", content=raw, headers={"Content-Type": "application/json"}, timeout=10)
        assert r.status_code == 200
    sent_pre, sent_dec = json.loads(pre_seen[-1]), json.loads(dec_seen[-1])
    assert sent_pre == sent_dec
    client = json.loads(raw)
    batch = len(client["text"]) if isinstance(client.get("text"), list) else (
        len(client["input_ids"]) if "input_ids" in client else None)
    for key, value in client.items():
        if not key.startswith("bootstrap_"):
            assert sent_dec[key] == value
    if batch is None:
        assert sent_dec["bootstrap_host"] == "127.0.0.1" and sent_dec["bootstrap_port"] == 8998
        assert 0 < sent_dec["bootstrap_room"] < 2**63 - 1024
    else:
        assert sent_dec["bootstrap_host"] == ["127.0.0.1"] * batch and sent_dec["bootstrap_port"] == [8998] * batch
        assert len(set(sent_dec["bootstrap_room"])) == batch and all(r > 0 for r in sent_dec["bootstrap_room"])
    assert dec_seen[-1].count(b"bootstrap_room") == 1  # client-sent PD fields replaced, not duplicated


def test_flush_cache_needs_the_admin_token_when_one_is_set(upstreams: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    pre, _ = upstreams["ok_prefill"]
    dec, _ = upstreams["ok_decode"]
    cfg = router_config(prefill=[(pre, 1)], decode=[dec], health_interval_s=60)
    cfg.admin_token = "s3cret"
    with start_router_in_thread(cfg) as router:
        r = httpx.post(router.url + "/flush_cache", timeout=10)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = httpx.post(router.url + "/flush_cache", headers={"Authorization": "Bearer s3cret"}, timeout=10)
        assert r.status_code in (200, 502) and "workers" in r.json()  # the stand-ins have no /flush_cache


def test_a_listen_address_in_use_is_a_usage_error_with_a_remedy(upstreams: Any) -> None:
    pre, _ = upstreams["ok_prefill"]
    dec, _ = upstreams["ok_decode"]
    port = int(pre.rsplit(":", 1)[1])
    with pytest.raises(UsageError, match=r"cannot listen on 127\.0\.0\.1") as err:
        start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec], listen=f"127.0.0.1:{port}"))
    assert err.value.remedy and "--listen" in err.value.remedy


def test_client_that_disconnects_is_counted_as_499_not_500(upstreams: Any) -> None:
    pre, _ = upstreams["ok_prefill"]
    dec, _ = upstreams["hang"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec], health_interval_s=60)) as router:
        body = b'{"text": "x"}'
        with socket.create_connection(("127.0.0.1", int(router.url.rsplit(":", 1)[1])), timeout=5) as s:
            s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 5
            while router.router.active == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
        deadline = time.monotonic() + 5
        while router.router.active and time.monotonic() < deadline:
            time.sleep(0.01)
        metrics = httpx.get(router.url + "/metrics", timeout=10).text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="499"} 1.0' in metrics
        assert 'status="500"' not in metrics


def test_sglang_deprecated_aliases_and_ready_are_served(upstreams: Any) -> None:
    pre, _ = upstreams["ok_prefill"]
    dec, _ = upstreams["ok_decode"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec], health_interval_s=60)) as router:
        # PD: the prefill's document plus every worker's per role (the gateway's shape)
        assert httpx.get(router.url + "/get_server_info", timeout=10).json() == {
            "status": "ok", "prefill": [{"status": "ok"}], "decode": [{"status": "ok"}]}
        assert httpx.get(router.url + "/ready", timeout=10).status_code == 200
        assert httpx.get(router.url + "/no_such_path", timeout=10).status_code == 404
