"""Stream failure semantics with stand-in upstreams whose faults are scripted (the simulator cannot
break a stream on demand): a decode stream that dies before its first byte is retried on another pair;
one that dies after it ends with an error event, never a retry; a slow worker hits the request timeout.
When the client's head goes out (router.stream_head): early, with the worker's head, and a stream that
then fails on every attempt ends as an error event; first_chunk, with the first token, and such a
stream is answered with an error status.
Real: the router, its upstream client, its retry loop and SSE relay."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.router.http import h1
from tests.router.standin_apps import serve_apps


def app(behaviour: str, calls: dict[str, int]) -> web.Application:

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        calls["n"] += 1
        if behaviour == "prefill":
            return web.json_response({"text": "", "meta_info": {"prompt_tokens": 2, "cached_tokens": 0}})
        if behaviour.startswith("ids_"):
            # a greedy model whose next id is a function of the context (100 + its length), streamed in the
            # simulator's shape (delta ids, cumulative text); a prompt [9, x] dies after the first event
            ctx_ids = body["input_ids"]
            out = [100 + len(ctx_ids) + k for k in range(body["sampling_params"]["max_new_tokens"])]
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for k, tok in enumerate(out):
                ev = {"text": "".join(f" t{t}" for t in out[:k + 1]), "output_ids": [tok],
                      "meta_info": {"id": "r", "completion_tokens": k + 1, "prompt_tokens": len(ctx_ids)}}
                await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                if ctx_ids[0] == 9 and len(ctx_ids) == 2:
                    await asyncio.sleep(0.05)
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if behaviour == "slow":
            await asyncio.sleep(1.5)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if behaviour == "head_then_slow":  # the head at once, the first token after a 0.4 s "prefill"
            await asyncio.sleep(0.4)
        if behaviour == "head_then_stall":
            await asyncio.sleep(1.5)
        if behaviour == "die_before_first_byte":
            request.transport.close()  # type: ignore[union-attr]
            return resp
        if behaviour.startswith("abort_"):
            # SGLang's decode when its prefill died before the KV transfer: a scheduler abort, no token
            status = int(behaviour.split("_")[1])
            fr = {"type": "abort", "message": "KV transfer failed", "status_code": status, "err_type": None}
            ev = {"text": "", "output_ids": [], "meta_info": {"completion_tokens": 0, "prompt_tokens": 2,
                                                             "finish_reason": fr}}
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\ndata: [DONE]\n\n")
            return resp
        await resp.write(b'data: {"text": "a", "meta_info": {"completion_tokens": 1}}\n\n')
        if behaviour == "first_then_stall":  # a token, then nothing within the request timeout
            await asyncio.sleep(1.5)
        if behaviour == "done_then_die":  # the whole answer, then the connection drops before its end
            await resp.write(b"data: [DONE]\n\n")
            await asyncio.sleep(0.05)
            request.transport.close()  # type: ignore[union-attr]
            return resp
        if behaviour == "done_then_stall":  # the whole answer, then the end of the response past the timeout
            await resp.write(b"data: [DONE]\n\n")
            await asyncio.sleep(1.5)
            return resp
        if behaviour == "die_after_first_byte":
            await asyncio.sleep(0.05)
            request.transport.close()  # type: ignore[union-attr]
            return resp
        await resp.write(b'data: {"text": "ab", "meta_info": {"completion_tokens": 2, "prompt_tokens": 2, "cached_tokens": 0}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        assert body["bootstrap_room"] >= 1
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    a = web.Application()
    for path in ("/generate", "/v1/chat/completions", "/v1/completions"):
        a.router.add_post(path, generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        a.router.add_get(path, ok)
    return a


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, tuple[str, dict]]]:
    with serve_apps(app, ("prefill", "ok", "die_before_first_byte", "die_after_first_byte", "slow", "abort_500",
                          "abort_400", "ids_a", "ids_b", "head_then_slow", "head_then_stall",
                          "first_then_stall", "done_then_stall", "done_then_die")) as urls:
        yield urls


def stream(url: str) -> list[str]:
    with httpx.stream("POST", url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
        assert r.status_code == 200
        return [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]


def test_stream_dying_before_first_byte_is_retried_on_another_decode(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    bad, bad_calls = upstreams["die_before_first_byte"]
    good, good_calls = upstreams["ok"]
    # round robin: the bad decode is chosen first on every other request
    cfg = router_config(prefill=[(pre, 1)], decode=[bad, good], health_interval_s=60, policy="round_robin")
    with start_router_in_thread(cfg) as router:
        for _ in range(4):
            lines = stream(router.url)
            assert lines[-1] == "[DONE]" and json.loads(lines[-2])["text"] == "ab"
        assert bad_calls["n"] >= 1 and good_calls["n"] >= 4
        assert 'inferctl_router_retries_total{cause="stream_' in httpx.get(router.url + "/metrics").text


def test_a_stream_aborted_before_its_first_token_is_retried_on_another_pair(upstreams) -> None:
    # SGLang's decode aborts a request whose prefill died before the KV transfer with a 500 abort event on
    # its 200 stream: nothing was generated, so it is a failed attempt like a stream ending before any data
    pre, _ = upstreams["prefill"]
    bad, bad_calls = upstreams["abort_500"]
    good, good_calls = upstreams["ok"]
    cfg = router_config(prefill=[(pre, 1)], decode=[bad, good], health_interval_s=60, policy="round_robin")
    with start_router_in_thread(cfg) as router:
        b0, g0 = bad_calls["n"], good_calls["n"]
        for _ in range(4):
            lines = stream(router.url)
            assert lines[-1] == "[DONE]" and json.loads(lines[-2])["text"] == "ab", lines
        assert bad_calls["n"] > b0 and good_calls["n"] >= g0 + 4
        assert 'inferctl_router_retries_total{cause="stream_abort"}' in httpx.get(router.url + "/metrics").text


def test_a_client_error_abort_is_passed_on_not_retried(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    bad, calls = upstreams["abort_400"]
    before = calls["n"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60)) as router:
        lines = stream(router.url)
        assert json.loads(lines[0])["meta_info"]["finish_reason"]["status_code"] == 400 and lines[-1] == "[DONE]"
        assert calls["n"] == before + 1


def test_a_stream_cut_after_its_first_event_continues_in_the_modes_other_streams_showed(upstreams) -> None:
    # one event shows neither whether ids are deltas nor whether text is: the fleet's other streams do
    pre, _ = upstreams["prefill"]
    cfg = router_config(prefill=[(pre, 1)], decode=[upstreams["ids_a"][0], upstreams["ids_b"][0]],
                        health_interval_s=60)

    def stream_ids(router: RouterHandle, prompt: list[int]) -> list[dict]:
        body = {"input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
        with httpx.stream("POST", router.url + "/generate", json=body, timeout=20) as r:
            lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [json.loads(ln) for ln in lines[:-1]]

    with start_router_in_thread(cfg) as router:
        assert stream_ids(router, [1, 2])[-1]["text"] == " t102 t103 t104"  # shows the modes
        events = stream_ids(router, [9, 2])  # cut after its first event
        assert [e.get("text") for e in events] == [" t102", " t102 t103", " t102 t103 t104"], events
        assert [e["output_ids"] for e in events] == [[102], [103], [104]]
        assert [e["meta_info"]["completion_tokens"] for e in events] == [1, 2, 3]


def test_stream_dying_after_first_byte_ends_with_an_error_event_and_no_retry(upstreams, caplog) -> None:
    pre, _ = upstreams["prefill"]
    bad, calls = upstreams["die_after_first_byte"]
    before = calls["n"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60)) as router:
        with caplog.at_level(logging.WARNING, logger="infer_ctl.router"):
            lines = stream(router.url)
        assert json.loads(lines[0])["text"] == "a"
        assert "error" in json.loads(lines[-2]) and lines[-1] == "[DONE]"
        broke = [r for r in caplog.records if r.getMessage() == "stream broke after first byte"]
        assert [getattr(r, "status", None) for r in broke] == [502]
        assert calls["n"] == before + 1  # exactly one attempt: bytes had reached the client
        metrics = httpx.get(router.url + "/metrics").text
        assert "inferctl_router_stream_errors_total 1.0" in metrics
        # the request failed: counted as the 502 its error event says, not as the head's 200
        assert 'inferctl_router_requests_total{endpoint="/generate",status="502"} 1.0' in metrics
        assert 'status="200"' not in metrics.split("inferctl_router_requests_total", 1)[1].split("# HELP")[0]


def test_request_timeout_is_a_504_json_error(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    slow, _ = upstreams["slow"]
    cfg = router_config(prefill=[(pre, 1)], decode=[slow], request_timeout_s=0.5, health_interval_s=60)
    with start_router_in_thread(cfg) as router:
        r = httpx.post(router.url + "/generate", json={"text": "x"}, timeout=10)
        assert r.status_code == 504 and r.json()["error"]["type"] == "server_error"


def head_and_first_event_s(url: str) -> tuple[float, float, int]:
    """Seconds to the response head and to the first body byte of a streamed request, and its status."""
    t = time.perf_counter()
    with httpx.stream("POST", url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
        head = time.perf_counter() - t
        for chunk in r.iter_raw():
            if chunk:
                return head, time.perf_counter() - t, r.status_code
    raise AssertionError("no body")


@pytest.mark.parametrize("when", ["early", "first_chunk"])
def test_the_client_head_goes_out_with_the_workers_head_or_with_the_first_token(upstreams, when: str) -> None:
    pre, _ = upstreams["prefill"]
    slow_first, _ = upstreams["head_then_slow"]
    cfg = router_config(prefill=[(pre, 1)], decode=[slow_first], health_interval_s=60, stream_head=when)
    with start_router_in_thread(cfg) as router:
        head, first, status = head_and_first_event_s(router.url)
    assert status == 200 and first >= 0.38
    if when == "early":  # the client has the head while the worker computes: not 0.4 s later
        assert head < 0.25, (head, first)
    else:
        assert head >= 0.38, (head, first)


def test_after_an_early_head_a_stream_failing_on_every_attempt_ends_as_an_error_event(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    bad, calls = upstreams["die_before_first_byte"]
    before = calls["n"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60,
                                              max_retries=2, retry_base_s=0)) as router:
        with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
            lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert calls["n"] == before + 3  # every attempt ran, within the one head
        err = json.loads(lines[0])["error"]
        assert err["code"] == 502 and err["type"] == "server_error" and "all 3 attempts failed" in err["message"]
        assert lines[1:] == ["[DONE]"]
        metrics = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="502"} 1.0' in metrics


def test_with_the_head_at_the_first_token_such_a_stream_is_a_502_json_error(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    bad, _ = upstreams["die_before_first_byte"]
    cfg = router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60, retry_base_s=0,
                        stream_head="first_chunk")
    with start_router_in_thread(cfg) as router:
        r = httpx.post(router.url + "/generate", json={"text": "x", "stream": True}, timeout=20)
        assert r.status_code == 502 and "all 3 attempts failed" in r.json()["error"]["message"]


def test_a_request_timeout_after_an_early_head_is_a_504_error_event(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    stall, _ = upstreams["head_then_stall"]
    cfg = router_config(prefill=[(pre, 1)], decode=[stall], request_timeout_s=0.5, health_interval_s=60)
    with start_router_in_thread(cfg) as router:
        with httpx.stream("POST", router.url + "/generate", json={"text": "x", "stream": True}, timeout=20) as r:
            assert r.status_code == 200
            lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert json.loads(lines[0])["error"]["code"] == 504 and lines[1:] == ["[DONE]"]
        m = httpx.get(router.url + "/metrics").text
        assert 'status="504"} 1.0' in m


def test_a_request_timeout_after_the_first_token_is_counted_as_its_504(upstreams, caplog) -> None:
    pre, _ = upstreams["prefill"]
    stall, _ = upstreams["first_then_stall"]
    cfg = router_config(prefill=[(pre, 1)], decode=[stall], request_timeout_s=0.5, health_interval_s=60)
    with start_router_in_thread(cfg) as router:
        with caplog.at_level(logging.WARNING, logger="infer_ctl.router"):
            lines = stream(router.url)
        # its log line says so too, as the 504 before the first token does
        logged = [r for r in caplog.records if r.getMessage() == "request failed"]
        assert [getattr(r, "status", None) for r in logged] == [504], caplog.records
        assert json.loads(lines[0])["text"] == "a"
        assert json.loads(lines[1])["error"]["code"] == 504 and lines[2:] == ["[DONE]"]
        m = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="504"} 1.0' in m
        assert 'inferctl_router_requests_total{endpoint="/generate",status="200"}' not in m


def test_a_request_timeout_after_done_went_out_is_a_success_with_no_error_event(upstreams) -> None:
    # the client has the whole answer ([DONE]; the worker's end of response is late): as a break after
    # [DONE] (relay.py), a success - counted 200, and no error event after the [DONE]
    pre, _ = upstreams["prefill"]
    late, _ = upstreams["done_then_stall"]
    cfg = router_config(prefill=[(pre, 1)], decode=[late], request_timeout_s=0.5, health_interval_s=60)
    with start_router_in_thread(cfg) as router:
        lines = stream(router.url)
        assert json.loads(lines[0])["text"] == "a" and lines[1:] == ["[DONE]"], lines
        m = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="200"} 1.0' in m
        assert 'inferctl_router_requests_total{endpoint="/generate",status="504"}' not in m


def test_a_client_gone_right_after_the_error_event_still_counts_the_502(upstreams, monkeypatch) -> None:
    # the worker's stream broke first: the client closing as its error event goes out (the OpenAI SDK
    # raises on it and closes) does not turn the router's 502 into the client's own 499. The close is
    # scripted (the end of the response fails as on a closed connection): a real one lands there only
    # when the client's socket is backed up
    pre, _ = upstreams["prefill"]
    bad, _ = upstreams["die_after_first_byte"]
    real_eof = h1.StreamResponse.write_eof

    async def gone_after_error(self: h1.StreamResponse) -> None:
        if self.outcome is not None:
            raise ConnectionResetError("client disconnected")
        await real_eof(self)

    monkeypatch.setattr(h1.StreamResponse, "write_eof", gone_after_error)
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60)) as router:
        with contextlib.suppress(httpx.HTTPError):
            stream(router.url)
        deadline = time.monotonic() + 5
        while 'status="502"' not in (m := httpx.get(router.url + "/metrics").text) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert 'inferctl_router_requests_total{endpoint="/generate",status="502"} 1.0' in m
        assert 'inferctl_router_requests_total{endpoint="/generate",status="499"}' not in m


def test_a_request_timeout_while_the_502_event_waits_on_the_client_adds_no_second_event(upstreams, monkeypatch) -> None:
    # the worker's stream broke; its error event is written (the socket's buffer has it) but the
    # client's socket is backed up, and the request timeout fires meanwhile: the stream ends as it
    # was going to (one error event, the 502), not with a 504 event after that one's [DONE]
    pre, _ = upstreams["prefill"]
    bad, _ = upstreams["die_after_first_byte"]
    real_write = h1.StreamResponse.write

    async def backed_up(self: h1.StreamResponse, data: bytes, last: bool = False) -> None:
        await real_write(self, data, last)
        if self.outcome == 502 and b'"code":502' in data:
            await asyncio.sleep(2)  # the drain of a client not reading

    monkeypatch.setattr(h1.StreamResponse, "write", backed_up)
    cfg = router_config(prefill=[(pre, 1)], decode=[bad], request_timeout_s=0.5, health_interval_s=60)
    with start_router_in_thread(cfg) as router:
        lines = stream(router.url)
        assert json.loads(lines[0])["text"] == "a"
        assert json.loads(lines[1])["error"]["code"] == 502 and lines[2:] == ["[DONE]"], lines
        m = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="502"} 1.0' in m
        assert 'status="504"' not in m


@pytest.mark.parametrize("endpoint", ["/v1/chat/completions", "/v1/completions"])
def test_an_openai_stream_broken_after_its_first_token_counts_502_on_its_endpoint(upstreams, endpoint: str) -> None:
    pre, _ = upstreams["prefill"]
    bad, _ = upstreams["die_after_first_byte"]
    body = {"model": "m", "stream": True, **({"messages": [{"role": "user", "content": "x"}]}
                                             if "chat" in endpoint else {"prompt": "x"})}
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60)) as router:
        with httpx.stream("POST", router.url + endpoint, json=body, timeout=20) as r:
            lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert json.loads(lines[-2])["error"]["code"] == 502 and lines[-1] == "[DONE]", lines
        m = httpx.get(router.url + "/metrics").text
        assert f'inferctl_router_requests_total{{endpoint="{endpoint}",status="502"}} 1.0' in m
        assert 'status="200"' not in m.split("inferctl_router_requests_total", 1)[1].split("# HELP")[0]


def test_a_tenants_stream_broken_after_its_first_token_is_its_error_and_keeps_its_charge(upstreams) -> None:
    from infer_ctl.router.observe.tenants import TenantSpec, key_digest

    key = "sk-tenant-a"
    tenants = [TenantSpec("a", key_digest(key), max_concurrency=1, tokens_per_min=6000)]
    pre, _ = upstreams["prefill"]
    bad, _ = upstreams["die_after_first_byte"]
    body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 1000}}
    cfg = router_config(prefill=[(pre, 1)], decode=[bad], health_interval_s=60, tenants=tenants)
    with start_router_in_thread(cfg) as router:
        with httpx.stream("POST", router.url + "/generate", json=body, timeout=20,
                          headers={"authorization": f"Bearer {key}"}) as r:
            lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert json.loads(lines[-2])["error"]["code"] == 502
        snap = httpx.get(router.url + "/admin/tenants", timeout=10).json()["tenants"][0]
        # the worker computed: its reservation (1,000 tokens and the prompt) stays charged, and the
        # failure is the tenant's error, its slot given back
        assert snap["inflight"] == 0 and snap["errors"] == 1, snap
        assert snap["buckets"]["tokens"] < 5100, snap


def test_a_worker_dropping_after_done_went_out_is_a_success(upstreams) -> None:
    pre, _ = upstreams["prefill"]
    late, _ = upstreams["done_then_die"]
    with start_router_in_thread(router_config(prefill=[(pre, 1)], decode=[late], health_interval_s=60)) as router:
        lines = stream(router.url)
        assert json.loads(lines[0])["text"] == "a" and lines[1:] == ["[DONE]"], lines
        m = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_requests_total{endpoint="/generate",status="200"} 1.0' in m
        assert 'status="502"' not in m and "inferctl_router_stream_errors_total 0.0" in m
