"""A stream whose head went out early (router.stream_head early, relay.py `send_head`) and then could
not go on as planned, with scripted stand-in workers: a worker's own 4xx on a retry, a client that
leaves between the head and the first token, a router bug after the head, an HTTP/1.0 client, a request
pipelined behind such a stream and an OpenAI stream. In each the client must read one well-formed
answer (one head, an error event, the stream's end) and the router count the request as it ended.
Real: the router, its HTTP server, its upstream client, its retry loop and SSE relay."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.router.config import RouterConfig
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from tests.router.standin_apps import serve_apps

REJECT = {"object": "error", "message": "max_new_tokens is too large", "type": "BadRequestError", "param": None,
          "code": 400}


def app(behaviour: str, calls: dict) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        calls["n"] += 1
        if behaviour == "prefill":
            return web.json_response({"text": "", "meta_info": {"prompt_tokens": 2, "cached_tokens": 0}})
        if behaviour == "reject":  # SGLang's validation error: an HTTP 400 with its JSON error
            return web.json_response(REJECT, status=400)
        if behaviour.startswith("prefill_"):  # a prefill that fails 0.2 s in (its decode waits for the KV)
            await asyncio.sleep(0.2)
            if behaviour == "prefill_400":
                return web.json_response(REJECT, status=400)
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if behaviour == "die":  # the head, then the connection closes before the first token
            request.transport.close()  # type: ignore[union-attr]
            return resp
        if behaviour == "watch":  # the head, then a long prefill: when did the router close the call?
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:
                await asyncio.sleep(0.02)
                if request.transport is None or request.transport.is_closing():
                    calls["closed_after_s"] = time.monotonic() - t0
                    return resp
            return resp
        await resp.write(b'data: {"text": "a", "meta_info": {"completion_tokens": 1}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    a = web.Application()
    for path in ("/generate", "/v1/chat/completions"):
        a.router.add_post(path, generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        a.router.add_get(path, ok)
    return a


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, tuple[str, dict]]]:
    with serve_apps(app, ("prefill", "die", "reject", "watch", "ok", "prefill_503", "prefill_400")) as urls:
        yield urls


def pd(upstreams: dict, *decodes: str, **settings: Any) -> RouterConfig:
    return router_config(prefill=[(upstreams["prefill"][0], 1)], decode=[upstreams[d][0] for d in decodes],
                         health_interval_s=60, retry_base_s=0, **settings)


def data_lines(r: httpx.Response) -> list[str]:
    return [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]


def requests_total(url: str, status: int, endpoint: str = "/generate") -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(f'inferctl_router_requests_total{{endpoint="{endpoint}",status="{status}"}}'):
            return float(line.split()[-1])
    return 0.0


def wait_for(check, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    return check()


def read_until_closed(sock: socket.socket, timeout: float = 10.0) -> bytes:
    sock.settimeout(timeout)
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_a_workers_4xx_on_a_retry_after_the_head_ends_the_stream_with_its_status_and_message(upstreams) -> None:
    # round robin: the first attempt on the decode that dies before its first token, the retry on the one
    # that refuses the request (400) - after the client's head went out
    with start_router_in_thread(pd(upstreams, "die", "reject", policy="round_robin")) as router:
        with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
            assert r.status_code == 200
            lines = data_lines(r)
        err = json.loads(lines[0])["error"]
        assert err["code"] == 400 and err["message"] == REJECT["message"] and err["type"] == "invalid_request_error"
        assert lines[1:] == ["[DONE]"]
        assert requests_total(router.url, 400) == 1 and requests_total(router.url, 200) == 0


def test_a_client_leaving_between_the_head_and_the_first_token_closes_the_call_and_counts_499(upstreams) -> None:
    _, watched = upstreams["watch"]
    with start_router_in_thread(pd(upstreams, "watch")) as router:
        host, port = router.url.removeprefix("http://").split(":")
        body = json.dumps({"text": "x", "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            head = sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 200 ") and b"text/event-stream" in head
        # the worker's call is closed at once (SGLang aborts the request), not at the end of its prefill
        assert wait_for(lambda: "closed_after_s" in watched, 4), watched
        assert watched["closed_after_s"] < 2
        assert wait_for(lambda: requests_total(router.url, 499) == 1)
        assert requests_total(router.url, 200) == 0


def test_a_router_bug_after_the_head_ends_the_stream_with_an_error_event_and_the_connection_goes_on(
        upstreams, monkeypatch) -> None:
    from infer_ctl.router.request import attempt

    def bug(first: bytes) -> int | None:
        raise RuntimeError("a bug between the head and the first token")

    monkeypatch.setattr(attempt, "aborted_before_output", bug)
    with start_router_in_thread(pd(upstreams, "ok")) as router, httpx.Client(timeout=20) as client:
        with client.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}) as r:
            assert r.status_code == 200
            lines = data_lines(r)
        assert json.loads(lines[0])["error"]["code"] == 500 and lines[1:] == ["[DONE]"]
        assert client.get(router.url + "/health").status_code == 200  # the same keep-alive connection
        assert requests_total(router.url, 500) == 1


def test_an_http10_client_reads_the_error_event_and_then_the_close(upstreams) -> None:
    with start_router_in_thread(pd(upstreams, "die")) as router:
        host, port = router.url.removeprefix("http://").split(":")
        body = json.dumps({"text": "x", "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /generate HTTP/1.0\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            raw = read_until_closed(sock)
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in head and b"chunked" not in head
        events = [e for e in rest.split(b"\n\n") if e]
        assert json.loads(events[0].removeprefix(b"data: "))["error"]["code"] == 502
        assert events[1:] == [b"data: [DONE]"]


def test_a_request_pipelined_behind_a_stream_ended_by_an_error_event_is_answered(upstreams) -> None:
    with start_router_in_thread(pd(upstreams, "die")) as router:
        host, port = router.url.removeprefix("http://").split(":")
        body = json.dumps({"text": "x", "stream": True}).encode()
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(body), body) +
                         b"GET /health HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
            raw = read_until_closed(sock)
        head, _, rest = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in head
        body_out = b""
        while True:  # the chunked body, to its terminator
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                rest = rest.removeprefix(b"\r\n")
                break
            body_out, rest = body_out + rest[:size], rest[size + 2:]
        events = [e for e in body_out.split(b"\n\n") if e]
        assert json.loads(events[0].removeprefix(b"data: "))["error"]["code"] == 502 and events[1:] == [b"data: [DONE]"]
        second, _, doc = rest.partition(b"\r\n\r\n")
        assert second.startswith(b"HTTP/1.1 200 ") and json.loads(doc)["status"] in ("ok", "degraded", "starting")


def test_an_openai_stream_failing_after_its_head_ends_with_an_openai_error_event(upstreams) -> None:
    with start_router_in_thread(pd(upstreams, "die")) as router:
        with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=20,
                          json={"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            lines = data_lines(r)
        err = json.loads(lines[0])["error"]
        assert set(err) >= {"message", "type", "code"} and err["code"] == 502 and err["type"] == "server_error"
        assert lines[1:] == ["[DONE]"]
        assert requests_total(router.url, 502, "/v1/chat/completions") == 1
        # the OpenAI SDK reads it as the stream's error, with the router's message
        import openai

        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=20)
        with pytest.raises(openai.APIError, match=r"all \d attempts failed"):
            for _ in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True):
                pass


def metric(url: str, prefix: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("when", ["early", "first_chunk"])
def test_a_request_timeout_before_the_first_token_is_counted_and_told_alike_whenever_the_head_went(
        upstreams, when: str) -> None:
    # the worker sends its head, then computes for longer than the request timeout
    with start_router_in_thread(pd(upstreams, "watch", request_timeout_s=0.5, stream_head=when)) as router:
        with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
            if when == "early":
                assert r.status_code == 200
                lines = data_lines(r)
                assert lines[1:] == ["[DONE]"]
                err = json.loads(lines[0])["error"]
            else:
                r.read()
                assert r.status_code == 504
                err = r.json()["error"]
        assert err["code"] == 504 and err["message"] == "no response within 0.5s"
        assert requests_total(router.url, 504) == 1
        assert metric(router.url, 'inferctl_router_rejected_total{reason="timeout"}') == 1


@pytest.mark.parametrize("prefill", ["prefill_503", "prefill_400"])
def test_a_prefill_failing_after_its_decodes_head_ends_the_attempt_at_once(upstreams, prefill: str) -> None:
    # SGLang sends a stream's head at once: a decode that answered has not yet had its KV. When its prefill
    # fails, the KV never comes; the decode (here: a head, then nothing) must not be waited for
    _, watched = upstreams["watch"]
    watched.pop("closed_after_s", None)
    cfg = router_config(prefill=[(upstreams[prefill][0], 1)], decode=[upstreams["watch"][0]], health_interval_s=60,
                        max_retries=0)
    with start_router_in_thread(cfg) as router:
        t0 = time.monotonic()
        with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
            assert r.status_code == 200
            lines = data_lines(r)
        took = time.monotonic() - t0
        err = json.loads(lines[0])["error"]
        if prefill == "prefill_400":  # the prefill's own refusal, passed on
            assert err["code"] == 400 and err["message"] == REJECT["message"]
        else:
            assert err["code"] == 502 and "prefill answered HTTP 503" in err["message"]
        assert lines[1:] == ["[DONE]"] and took < 2, took
        assert wait_for(lambda: "closed_after_s" in watched, 4) and watched["closed_after_s"] < 2
        assert requests_total(router.url, err["code"]) == 1


def test_a_tenants_stream_failing_after_its_head_is_settled_by_the_errors_status(upstreams) -> None:
    from infer_ctl.router.observe.tenants import TenantSpec, key_digest

    key = "sk-tenant-a"
    tenants = [TenantSpec("a", key_digest(key), max_concurrency=1, tokens_per_min=6000)]
    auth = {"authorization": f"Bearer {key}"}
    body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 1000}}

    def tenant(url: str) -> dict:
        return httpx.get(url + "/admin/tenants", timeout=10).json()["tenants"][0]

    # the worker's own 400 on the retry, after the head: the tenant's reservation comes back, no error
    with start_router_in_thread(pd(upstreams, "die", "reject", policy="round_robin", tenants=tenants)) as router:
        with httpx.stream("POST", router.url + "/generate", json=body, headers=auth, timeout=20) as r:
            assert json.loads(data_lines(r)[0])["error"]["code"] == 400
        snap = tenant(router.url)
        assert snap["inflight"] == 0 and snap["errors"] == 0 and snap["buckets"]["tokens"] > 5900, snap
    # every attempt failed (502): an error of the tenant's, and its slot given back
    with start_router_in_thread(pd(upstreams, "die", tenants=tenants)) as router:
        with httpx.stream("POST", router.url + "/generate", json=body, headers=auth, timeout=20) as r:
            assert json.loads(data_lines(r)[0])["error"]["code"] == 502
        snap = tenant(router.url)
        assert snap["inflight"] == 0 and snap["errors"] == 1, snap
