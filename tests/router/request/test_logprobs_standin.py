"""Input-logprob merge (non-streaming and streaming) through the real router and upstream client.

The simulator does not compute logprobs, so the upstreams here are stand-ins: two tiny aiohttp apps that
answer /generate the way an SGLang prefill and decode do when `return_logprob` is set (the prefill holds
the prompt's input logprobs, the decode only its own). What is real: the router, its HTTP client, SSE
parsing and the PD request path (both stand-ins check the bootstrap fields they receive)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web

from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

PREFILL_LP = [[None, 11, None], [-0.5, 12, None]]
DECODE_LP = [[-0.25, 13, None]]


def _meta(lp: list, n: int) -> dict:
    return {"id": "x", "prompt_tokens": 3, "completion_tokens": n, "cached_tokens": 0, "input_token_logprobs": lp,
            "finish_reason": {"type": "length", "length": n}}


def standin_app(role: str) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert body["bootstrap_room"] >= 1 and body["bootstrap_host"] == "127.0.0.1"
        lp = PREFILL_LP if role == "prefill" else DECODE_LP
        if not body.get("stream"):
            return web.json_response({"text": "" if role == "prefill" else "abc", "meta_info": _meta(lp, 0 if role == "prefill" else 3)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(1 if role == "prefill" else 3):
            await resp.write(f"data: {json.dumps({'text': 'a' * (i + 1), 'meta_info': _meta(lp, i + 1)})}\n\n".encode())
            await asyncio.sleep(0.01)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        app.router.add_get(path, ok)
    return app


@pytest.fixture(scope="module")
def standins() -> Iterator[tuple[str, str]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners = []

    async def start(role: str) -> str:
        runner = web.AppRunner(standin_app(role))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    urls = tuple(asyncio.run_coroutine_threadsafe(start(r), loop).result(10) for r in ("prefill", "decode"))
    yield urls  # type: ignore[misc]
    for r in runners:
        asyncio.run_coroutine_threadsafe(r.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_non_streaming_merge(standins: tuple[str, str]) -> None:
    pre, dec = standins
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec])) as router:
        r = httpx.post(router.url + "/generate", json={"text": "abc", "return_logprob": True}, timeout=10)
        assert r.status_code == 200
        assert r.json()["meta_info"]["input_token_logprobs"] == PREFILL_LP + DECODE_LP
        plain = httpx.post(router.url + "/generate", json={"text": "abc"}, timeout=10).json()
        assert plain["meta_info"]["input_token_logprobs"] == DECODE_LP  # not asked: passed through untouched


def test_streaming_merge_on_every_chunk(standins: tuple[str, str]) -> None:
    pre, dec = standins
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[dec])) as router, \
            httpx.stream("POST", router.url + "/generate", timeout=10,
                         json={"text": "abc", "stream": True, "return_logprob": True}) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    assert len(chunks) == 3
    assert all(c["meta_info"]["input_token_logprobs"] == PREFILL_LP + DECODE_LP for c in chunks)
