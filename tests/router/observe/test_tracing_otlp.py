"""OpenTelemetry traces of the router, received by a real OTLP receiver (tests/router/otlp_receiver.py:
OTLP/HTTP and OTLP/gRPC servers decoding with the official opentelemetry-proto classes) from the router's
own SDK exporter, in front of simulated SGLang workers (real PD bootstrap) or header-recording stand-ins."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from infer_ctl.core.routing import spec_fields as sf
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.router.observe.tracing import TracingConfig, config_from
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_specs
from tests.router.otlp_receiver import GrpcReceiver, HttpReceiver

pytest.importorskip("opentelemetry.sdk", reason="the otel extra: pip install 'inferctl[otel]'")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
SERVER, CLIENT, INTERNAL = 2, 3, 1  # opentelemetry.proto.trace.v1.Span.SpanKind


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread(pd_specs(1, 1))
    yield c
    c.stop()


def _router(cluster: ThreadedSimCluster, tracing: TracingConfig, **kw: Any) -> Any:
    pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
    return start_router_in_thread(router_config(prefill=pre, decode=dec, tracing=tracing, model_name="sim-70b",
                                                health_interval_s=0.5, **kw))


def _tree(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    return by_name


def _check_pd_trace(spans: list[dict[str, Any]], answer: Any) -> dict[str, Any]:
    """One trace, the client's: request span (child of the client's span) > attempt > prefill, decode
    (> kv_wait), with the answer's usage on the request span. Returns the request span."""
    assert {s["trace_id"] for s in spans} == {TRACE_ID}
    names = _tree(spans)
    (req,) = [s for s in spans if s["kind"] == SERVER]
    assert req["parent_span_id"] == CLIENT_SPAN
    assert req["name"] == "text_completion sim-70b"
    (attempt,) = names["attempt"]
    assert attempt["parent_span_id"] == req["span_id"] and attempt["kind"] == INTERNAL
    (pre,), (dec,) = names["prefill"], names["decode"]
    for call in (pre, dec):
        assert call["parent_span_id"] == attempt["span_id"] and call["kind"] == CLIENT
        assert call["attributes"]["http.response.status_code"] == 200
        assert call["attributes"]["server.address"] == "127.0.0.1"
    (kv,) = names["kv_wait"]
    assert kv["parent_span_id"] == dec["span_id"]
    assert dec["start"] <= kv["start"] <= kv["end"] <= dec["end"]
    assert kv["end"] <= pre["end"] + 1_000_000  # ends when the prefill answered (its span ends right after)
    a = req["attributes"]
    meta = (answer[0] if isinstance(answer, list) else answer)["meta_info"]
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "sim-70b"
    assert a["gen_ai.usage.input_tokens"] == meta["prompt_tokens"]
    assert a["gen_ai.usage.output_tokens"] == meta["completion_tokens"]
    assert a["gen_ai.usage.cache_read.input_tokens"] == meta["cached_tokens"]
    assert a["gen_ai.response.id"] == meta["id"]
    assert a["inferctl.prefill"] == pre["attributes"]["url.full"].removesuffix("/generate")
    assert a["inferctl.decode"] == dec["attributes"]["url.full"].removesuffix("/generate")
    assert a["inferctl.routing.reason"] and a["inferctl.attempts"] == 1
    assert "inferctl.cache.predicted_tokens" in a and a["http.response.status_code"] == 200
    room = attempt["attributes"]["inferctl.bootstrap_room"]
    assert isinstance(room, int) and room >= 1
    spec = [f for f in sf.decode_generate_response(answer) if f is not None]
    assert spec  # the simulated decode speculates (EAGLE3 on its default preset): this request's numbers
    assert a["inferctl.spec.accept_length"] == pytest.approx(spec[0].accept_length, rel=1e-3)
    assert a["inferctl.spec.accept_rate"] == pytest.approx(spec[0].accept_rate, rel=1e-3)
    return req


def test_a_pd_request_is_one_trace_over_otlp_http_with_the_clients_trace_id(cluster: ThreadedSimCluster) -> None:
    rx = HttpReceiver()
    try:
        router = _router(cluster, TracingConfig("http/protobuf", rx.endpoint, "router-under-test", None))
        try:
            r = httpx.post(router.url + "/generate", headers={"traceparent": TRACEPARENT}, timeout=30,
                           json={"text": "trace me " * 20, "sampling_params": {"max_new_tokens": 8, "temperature": 0.5}})
            assert r.status_code == 200, r.text
        finally:
            router.stop()  # flushes the batch processor
        spans = rx.wait_for(5)
        assert len(spans) == 5, [s["name"] for s in spans]
        req = _check_pd_trace(spans, r.json())
        assert req["attributes"]["gen_ai.request.max_tokens"] == 8
        assert req["attributes"]["gen_ai.request.temperature"] == 0.5
        assert req["attributes"]["gen_ai.request.stream"] is False
        assert {s["service"] for s in spans} == {"router-under-test"}
    finally:
        rx.close()


def test_a_streamed_request_over_otlp_grpc_carries_ttft_and_itl(cluster: ThreadedSimCluster) -> None:
    rx = GrpcReceiver()
    try:
        router = _router(cluster, TracingConfig("grpc", rx.endpoint, None, None))
        try:
            events = []
            with httpx.stream("POST", router.url + "/generate", headers={"traceparent": TRACEPARENT}, timeout=30,
                              # 48 tokens: spread over enough reads that a loaded machine does not hand the
                              # router the whole answer in one chunk (one chunk has no gap to measure)
                              json={"text": "stream me " * 20, "stream": True,
                                    "sampling_params": {"max_new_tokens": 48}}) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
        finally:
            router.stop()
        spans = rx.wait_for(5)
        req = _check_pd_trace(spans, events[-1])
        a = req["attributes"]
        assert a["gen_ai.request.stream"] is True
        assert 0 < a["gen_ai.response.time_to_first_chunk"] == a["inferctl.ttft_s"]
        assert a["inferctl.mean_itl_s"] > 0
    finally:
        rx.close()


def test_sampling_ratio_zero_records_new_traces_never_but_continues_a_sampled_client(cluster: ThreadedSimCluster) -> None:
    rx = HttpReceiver()
    try:
        router = _router(cluster, TracingConfig("http/protobuf", rx.endpoint, None, 0.0))
        try:
            body = {"text": "sampled? " * 10, "sampling_params": {"max_new_tokens": 2}}
            assert httpx.post(router.url + "/generate", json=body, timeout=30).status_code == 200
            assert httpx.post(router.url + "/generate", json=body, timeout=30,
                              headers={"traceparent": TRACEPARENT}).status_code == 200
        finally:
            router.stop()
        spans = rx.wait_for(5)
        assert {s["trace_id"] for s in spans} == {TRACE_ID}
    finally:
        rx.close()


# ---- what the workers receive -------------------------------------------------------------------
def _recording_app(role: str, seen: list[dict[str, Any]], delay_s: float = 0.0) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append({"role": role, "headers": dict(request.headers), "body": body})
        await asyncio.sleep(delay_s)
        return web.json_response({"text": "ok", "meta_info": {
            "id": "r1", "prompt_tokens": 5, "completion_tokens": 0 if role == "prefill" else 2, "cached_tokens": 1,
            "finish_reason": {"type": "length", "length": 2}}})

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/server_info", "/v1/loads"):
        app.router.add_get(path, ok)
    return app


@pytest.fixture
def recording() -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    yield from _recording_pair()


@pytest.fixture
def slow_prefill() -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    yield from _recording_pair(prefill_delay_s=1.0)


def _recording_pair(prefill_delay_s: float = 0.0) -> Iterator[tuple[str, str, list[dict[str, Any]]]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    seen: list[dict[str, Any]] = []
    runners: list[web.AppRunner] = []

    async def start(role: str) -> str:
        runner = web.AppRunner(_recording_app(role, seen, prefill_delay_s if role == "prefill" else 0.0))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    pre = asyncio.run_coroutine_threadsafe(start("prefill"), loop).result(10)
    dec = asyncio.run_coroutine_threadsafe(start("decode"), loop).result(10)
    yield pre, dec, seen
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _one_traced_request(pre: str, dec: str, rx: HttpReceiver, headers: dict[str, str],
                        before_stop: Callable[[RouterHandle], None] = lambda router: None) -> RouterHandle:
    """A PD router exporting to `rx` serves one /generate with `headers`; `before_stop` looks at it while
    it still runs; then it is stopped (which flushes its spans)."""
    router = start_router_in_thread(router_config(
        prefill=[(pre, 8998)], decode=[dec], tracing=TracingConfig("http/protobuf", rx.endpoint, None, None)))
    try:
        r = httpx.post(router.url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}},
                       headers=headers, timeout=30)
        assert r.status_code == 200, r.text
        before_stop(router)
    finally:
        router.stop()
    return router


def test_both_workers_get_the_clients_trace_with_their_call_span_as_parent(recording: Any) -> None:
    pre, dec, seen = recording
    rx = HttpReceiver()
    try:
        _one_traced_request(pre, dec, rx, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"})
        spans = {s["name"]: s for s in rx.wait_for(4)}  # the request, its attempt, the two calls
        for call in seen:
            tp = call["headers"]["traceparent"].split("-")
            assert tp[1] == TRACE_ID, call["role"]
            assert tp[2] == spans[call["role"]]["span_id"], call["role"]  # the router's call span is the parent
            assert call["headers"]["tracestate"] == "vendor=1"
        assert sorted(c["role"] for c in seen) == ["decode", "prefill"]
    finally:
        rx.close()


def test_a_prefill_answering_after_the_decode_is_waited_for_at_shutdown(slow_prefill: Any) -> None:
    # the client has the decode's answer while the prefill's is still on its way (left to finish, not
    # cancelled): stopping the router drains it too, so its call span ends and is exported
    pre, dec, _ = slow_prefill
    rx = HttpReceiver()

    def still_due(router: RouterHandle) -> None:
        assert len(router.server.router.attempts.lingering) == 1  # the prefill's answer is still due

    try:
        router = _one_traced_request(pre, dec, rx, {"traceparent": TRACEPARENT}, still_due)
        spans = {s["name"]: s for s in rx.wait_for(4)}
        assert sorted(spans) == ["attempt", "decode", "prefill", "text_completion"], sorted(spans)
        assert spans["prefill"]["status"] != 2, spans["prefill"]  # ended as answered, not as an error
        assert not router.server.router.attempts.lingering
    finally:
        rx.close()


# ---- off unless configured ----------------------------------------------------------------------
def test_tracing_is_off_unless_configured_and_reads_the_standard_environment() -> None:
    from infer_ctl.profile.tracing import TracingSettings

    assert config_from(TracingSettings(), {}) is None
    assert config_from(None, {"OTEL_SERVICE_NAME": "x"}) is None
    on = config_from(TracingSettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert on is not None and on.protocol == "http/protobuf" and on.endpoint is None  # the exporter reads it
    assert config_from(TracingSettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}) is None
    assert config_from(TracingSettings(enabled=False), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) is None
    grpc = config_from(TracingSettings(endpoint="http://c:4317"), {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc is not None and (grpc.protocol, grpc.endpoint) == ("grpc", "http://c:4317")
    http = config_from(TracingSettings(endpoint="http://c:4318", sample_ratio=0.25), {})
    assert http is not None and (http.endpoint, http.sample_ratio) == ("http://c:4318/v1/traces", 0.25)


def test_exporter_headers_come_from_the_environment_only(cluster: ThreadedSimCluster, monkeypatch: Any) -> None:
    from pydantic import ValidationError

    from infer_ctl.profile.tracing import TracingSettings

    with pytest.raises(ValidationError, match="OTEL_EXPORTER_OTLP_HEADERS"):
        TracingSettings.model_validate({"endpoint": "http://c:4318", "headers": {"api-key": "secret"}})
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=s3cret")
    rx = HttpReceiver()
    try:
        router = _router(cluster, TracingConfig("http/protobuf", rx.endpoint, None, None))
        try:
            assert httpx.post(router.url + "/generate", json={"text": "h", "sampling_params": {"max_new_tokens": 1}},
                              timeout=30).status_code == 200
        finally:
            router.stop()
        assert rx.wait_for(5) and rx.headers[0].get("x-api-key") == "s3cret"
    finally:
        rx.close()


def test_a_router_without_tracing_does_not_import_opentelemetry() -> None:
    code = ("import sys; from infer_ctl.router.daemon.embed import router_config, start_router_in_thread; "
            "h = start_router_in_thread(router_config(workers=['http://127.0.0.1:9'])); h.stop(); "
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# ---- the seed's span, attribute by attribute ------------------------------------------------------
def _sse_objects(r: httpx.Response) -> list[Any]:
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _ask(router: RouterHandle, kind: str, trace_id: str) -> tuple[Any, Any]:
    """One request of `kind` under the client's trace `trace_id`: (the answer's usage holder, its speculative
    fields holder) as the client received them."""
    headers = {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
    if kind == "generate":
        r = httpx.post(router.url + "/generate", headers=headers, timeout=30,
                       json={"text": "the span " * 20, "sampling_params": {"max_new_tokens": 16, "temperature": 0.3}})
        assert r.status_code == 200, r.text
        return r.json(), r.json()
    if kind == "generate_stream":
        with httpx.stream("POST", router.url + "/generate", headers=headers, timeout=30, json={
                "text": "the span " * 20, "stream": True,
                "sampling_params": {"max_new_tokens": 16, "temperature": 0.3}}) as r:
            assert r.status_code == 200
            objs = _sse_objects(r)
        return objs[-1], objs[-1]  # the last chunk's meta_info: the usage and the speculative fields
    body: dict[str, Any] = {"model": "sim-70b", "messages": [{"role": "user", "content": "the span " * 20}],
                            "max_tokens": 16, "temperature": 0.3}
    if kind == "chat":
        r = httpx.post(router.url + "/v1/chat/completions", headers=headers, timeout=30, json=body)
        assert r.status_code == 200, r.text
        return r.json(), r.json()
    with httpx.stream("POST", router.url + "/v1/chat/completions", headers=headers, timeout=30,
                      json={**body, "stream": True}) as r:
        assert r.status_code == 200
        objs = _sse_objects(r)
    # SGLang's stream: the speculative fields in a chunk of their own (empty choices), then the usage chunk
    (ext,) = [o for o in objs if "sglext" in o]
    assert ext["choices"] == [] and objs[-1]["choices"] == [] and "usage" in objs[-1]
    return objs[-1], ext


@pytest.mark.parametrize("kind", ["generate", "generate_stream", "chat", "chat_stream"])
def test_the_request_span_carries_what_sglang_and_the_router_measured(cluster: ThreadedSimCluster, kind: str) -> None:
    rx = HttpReceiver()
    trace_id = {"generate": "1" * 32, "chat": "2" * 32, "chat_stream": "3" * 32, "generate_stream": "4" * 32}[kind]
    dec_url = next(w.url for w in cluster.workers if w.spec.role == "decode")
    info = httpx.get(dec_url + "/server_info", timeout=10).json()
    try:
        router = _router(cluster, TracingConfig("http/protobuf", rx.endpoint, None, None))
        try:
            # a first request through the pair, then a health poll: the prefill's /v1/loads reports that
            # transfer (the pair's KV numbers) and the decode's /server_info its speculation and fabric
            assert httpx.post(router.url + "/generate", json={"text": "warm " * 20, "sampling_params": {
                "max_new_tokens": 2}}, timeout=30).status_code == 200
            deadline = time.monotonic() + 10
            while not any(p.samples for p in router.server.router.pairs.health.pairs.values()):
                assert time.monotonic() < deadline, "no KV transfer sample"
                time.sleep(0.1)
            usage_holder, spec_holder = _ask(router, kind, trace_id)
        finally:
            router.stop()
        spans = [s for s in rx.wait_for(10) if s["trace_id"] == trace_id]
        (req,) = [s for s in spans if s["kind"] == SERVER]
    finally:
        rx.close()
    a = req["attributes"]
    # GenAI semantic conventions
    assert a["gen_ai.request.model"] == "sim-70b" and a["gen_ai.request.temperature"] == 0.3
    assert a["gen_ai.request.max_tokens"] == 16
    if kind.startswith("generate"):
        meta = usage_holder["meta_info"]
        prompt, completion, cached = meta["prompt_tokens"], meta["completion_tokens"], meta["cached_tokens"]
        spec = sf.decode_generate_response(spec_holder)
    else:
        u = usage_holder["usage"]
        prompt, completion = u["prompt_tokens"], u["completion_tokens"]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
        spec = sf.decode_openai_response(spec_holder)
    assert a["gen_ai.usage.input_tokens"] == prompt and a["gen_ai.usage.output_tokens"] == completion
    assert a["gen_ai.response.finish_reasons"] == ["length"]
    # SGLang's per-request speculative fields (meta_info / sglext.spec_tokens_details)
    (f,) = [x for x in spec if x is not None]
    assert a["inferctl.spec.verify_steps"] == f.verify_ct
    assert a["inferctl.spec.drafted_tokens"] == f.num_proposed_drafts
    assert a["inferctl.spec.accepted_tokens"] == f.num_correct_drafts
    assert a["inferctl.spec.accept_length"] == pytest.approx(f.accept_length, rel=1e-3)
    assert a["inferctl.spec.gamma"] == info["speculative_num_draft_tokens"] - 1 == 3
    assert a["inferctl.spec.speedup"] == pytest.approx(f.accept_length / (3 * 0.1 + 1), rel=1e-3)
    # the decode's /server_info
    assert a["inferctl.spec.draft_model"] == info["speculative_draft_model_path"]
    assert a["inferctl.spec.num_steps"] == info["speculative_num_steps"]
    assert a["inferctl.spec.algorithm"] == "EAGLE3"
    assert a["inferctl.kv.transfer_backend"] == info["disaggregation_transfer_backend"]
    # the router's pair measurement (the prefill's last KV transfer) and prefix flags
    assert a["inferctl.kv.transfer_ms"] > 0 and a["inferctl.kv.transfer_gb_s"] > 0
    assert a["inferctl.kv.transfer_bytes"] == int(a["inferctl.kv.transfer_gb_s"] * 1e9 * a["inferctl.kv.transfer_ms"] / 1e3)
    assert a["inferctl.cache.prefix_match"] is (cached > 0)  # the worker's cached_tokens, as a flag
    assert isinstance(a["inferctl.cache.predicted_match"], bool)
    if kind.endswith("stream"):  # the router's own clock: gaps between content chunks
        assert 0 < a["inferctl.itl.p50_s"] <= a["inferctl.itl.p99_s"] <= a["inferctl.itl.max_s"]
        assert a["inferctl.itl.chunks"] >= 2
    else:
        assert "inferctl.itl.p50_s" not in a
