"""OpenTelemetry traces of the router's requests (docs/observability.md).

One trace per client request, continuing the client's W3C `traceparent` when it sends one:

    <operation> <model>        SERVER   the request at the router (admission, retries, the answer)
      attempt                  INTERNAL one per attempt, on one prefill/decode pair (or worker)
        prefill | decode | worker  CLIENT   the upstream call; its context goes to the worker as traceparent
          kv_wait              INTERNAL (under decode) from the decode call until the prefill answered

SGLang's prefill answers only once its KV transfer to the decode succeeded (sglang 0.5.23
srt/disaggregation/prefill.py, process_disagg_prefill_inflight_queue: the request is released on
KVPoll.Success), so the decode cannot produce its first token before that: the KV-wait span is the
decode's wait for prefill + KV transfer, as the router sees it.

Attributes follow OpenTelemetry's GenAI semantic conventions where one exists
(https://github.com/open-telemetry/semantic-conventions-genai, model/gen-ai/registry.yaml: gen_ai.
operation.name, gen_ai.provider.name, gen_ai.request.*, gen_ai.response.*, gen_ai.usage.input_tokens,
gen_ai.usage.output_tokens, gen_ai.usage.cache_read.input_tokens, gen_ai.response.time_to_first_chunk)
and HTTP/server ones for the calls (http.response.status_code, server.address, server.port); the rest
is `inferctl.*` (span_attrs.py: each one's source).

The OpenTelemetry SDK is imported only when tracing is configured (`Tracing.start`): a router without
tracing never loads it, and its request path pays one `is None` check per hook.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from infer_ctl.errors import UsageError
from infer_ctl.router.http.sse import event_json
from infer_ctl.router.observe.span_attrs import (
    MAX_GAPS,
    decode_attributes,
    itl_attributes,
    kv_attributes,
    spec_attributes,
)
from infer_ctl.router.observe.spec_stats import fields_of

if TYPE_CHECKING:
    from infer_ctl.profile.tracing import TracingSettings

log = logging.getLogger("infer_ctl.router")

DEFAULT_SERVICE = "inferctl-router"
PROTOCOLS = ("grpc", "http/protobuf")
_OPERATIONS = {"/v1/chat/completions": "chat", "/v1/completions": "text_completion", "/generate": "text_completion"}


@dataclass(frozen=True)
class TracingConfig:
    protocol: str
    #: None: the exporter's own OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT (or its default)
    endpoint: str | None
    service_name: str | None
    #: None: the SDK's OTEL_TRACES_SAMPLER[_ARG] (default: parent-based, always on)
    sample_ratio: float | None


@dataclass
class ServingFacts:
    """What the router knows of the workers that served a request, read when its span ends: the decodes'
    /server_info (spec_stats.SpecStats), the pairs' KV transfers (fleet/pair_health.PairTracker), the
    speedup model's cost ratio (the profile's speculative.cost_ratio)."""

    spec: Any = None
    pairs: Any = None
    cost_ratio: float = 0.1
    clock: Callable[[], float] = field(default=time.monotonic)


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() in ("1", "true", "yes", "on")


def config_from(settings: TracingSettings | None, env: Mapping[str, str]) -> TracingConfig | None:
    """The tracing of a router, or None when it is off: off unless `enabled` is true or an endpoint is
    configured (the profile's, or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT);
    OTEL_SDK_DISABLED=true and OTEL_TRACES_EXPORTER=none turn it off as they do for any OTel SDK."""
    endpoint = settings.endpoint if settings else None
    enabled = settings.enabled if settings else None
    if enabled is False or _truthy(env.get("OTEL_SDK_DISABLED")) or env.get("OTEL_TRACES_EXPORTER", "").strip() == "none":
        return None
    env_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not enabled and not endpoint and not env_endpoint:
        return None
    protocol = ((settings.protocol if settings else None) or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol not in PROTOCOLS:
        raise UsageError(f"OTLP protocol {protocol!r} is not supported by the router",
                         remedy="use grpc or http/protobuf (router.tracing.protocol or OTEL_EXPORTER_OTLP_PROTOCOL)")
    if endpoint and protocol == "http/protobuf" and urlsplit(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # as the SDK does with OTEL_EXPORTER_OTLP_ENDPOINT
    return TracingConfig(protocol, endpoint, settings.service_name if settings else None,
                         settings.sample_ratio if settings else None)


def _ns() -> int:
    return time.time_ns()


class Tracing:
    """The router's tracer provider and exporter (one per router)."""

    def __init__(self, cfg: TracingConfig, facts: ServingFacts | None = None) -> None:
        try:
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as exc:
            raise UsageError(f"tracing is configured but the OpenTelemetry SDK is not installed ({exc.name})",
                             remedy="pip install 'inferctl[otel]', or turn tracing off (router.tracing.enabled: false)") from None
        if cfg.protocol == "grpc":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            except ImportError as exc:
                raise UsageError(f"OTLP/gRPC needs {exc.name}", remedy="pip install 'inferctl[otel]'") from None
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # type: ignore[assignment]
        attrs = {}
        if cfg.service_name or not os.environ.get("OTEL_SERVICE_NAME"):
            attrs[SERVICE_NAME] = cfg.service_name or DEFAULT_SERVICE
        sampler = None if cfg.sample_ratio is None else ParentBased(TraceIdRatioBased(cfg.sample_ratio))
        self.provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
        exporter = OTLPSpanExporter(endpoint=cfg.endpoint) if cfg.endpoint else OTLPSpanExporter()
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("infer_ctl.router")
        self.propagator = TraceContextTextMapPropagator()
        self.SERVER, self.CLIENT, self.INTERNAL = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
        self.Status, self.ERROR = Status, StatusCode.ERROR
        self.in_context = set_span_in_context
        self.cfg = cfg
        #: the serving workers' facts (request/observe.py gives them from the router's parts)
        self.facts = facts

    def request(self, headers: Mapping[str, str], endpoint: str, rid: str) -> RequestTrace:
        return RequestTrace(self, headers, endpoint, rid)

    def flush(self, timeout_s: float = 10.0) -> bool:
        return bool(self.provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        self.provider.shutdown()


def _sampling(body: Mapping[str, Any], endpoint: str) -> Mapping[str, Any]:
    sp = body.get("sampling_params") if endpoint == "/generate" else body
    return sp if isinstance(sp, Mapping) else {}


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class RequestTrace:
    """The spans of one request. Calls arrive from the request's task and its prefill task, one at a time
    (one event loop), so no lock."""

    def __init__(self, tracing: Tracing, headers: Mapping[str, str], endpoint: str, rid: str) -> None:
        self.t = tracing
        parent = tracing.propagator.extract(headers) if "traceparent" in headers else None
        self.endpoint = endpoint
        self.operation = _OPERATIONS.get(endpoint, "text_completion")
        self.span = tracing.tracer.start_span(self.operation, context=parent, kind=tracing.SERVER, attributes={
            "gen_ai.operation.name": self.operation, "gen_ai.provider.name": "sglang",
            "http.request.method": "POST", "http.route": endpoint, "inferctl.request_id": rid})
        self.attempt: Any = None
        self.decode_started_ns: int | None = None
        self.decode_span: Any = None
        self.prefill_done_ns: int | None = None
        #: the workers' facts, read at the end
        self.facts = tracing.facts
        #: a stream's content chunks' arrival times (ITL percentiles) and its `sglext` event: SGLang sends
        #: an OpenAI stream's speculative fields in a chunk of their own before the usage chunk
        #: (serving_chat.py, only with return_spec_tokens_details), never in the last event
        self.chunk_times: list[float] = []
        self.stream_ext: Any = None
        #: an OpenAI stream's finish reason per choice: sent on each choice's last delta, before the usage
        #: chunk that ends the stream (whose `choices` is empty)
        self.stream_finish: dict[int, str] = {}

    # ---- the request ---------------------------------------------------------------------------
    def describe(self, body: Mapping[str, Any], model: str | None, tenant: str | None) -> None:
        """The request's GenAI attributes, from its parsed body."""
        s = self.span
        m = body.get("model") if isinstance(body.get("model"), str) else model
        if m:
            s.set_attribute("gen_ai.request.model", m)
            s.update_name(f"{self.operation} {m}")
        sp = _sampling(body, self.endpoint)
        mt: Any = sp.get("max_new_tokens") if self.endpoint == "/generate" else (
            body.get("max_completion_tokens") or body.get("max_tokens"))
        if _number(mt):
            s.set_attribute("gen_ai.request.max_tokens", int(mt))
        for key in ("temperature", "top_p"):
            if _number(sp.get(key)):
                s.set_attribute(f"gen_ai.request.{key}", float(sp[key]))
        s.set_attribute("gen_ai.request.stream", bool(body.get("stream")))
        if tenant:
            s.set_attribute("inferctl.tenant", tenant)

    def answered(self, obj: Any, prompt: int | None, cached: int | None, completion: int | None,
                 predicted_tokens: int, spec: list[Any]) -> None:
        s = self.span
        item = obj[0] if isinstance(obj, list) and obj else obj
        if isinstance(item, dict):
            meta = item.get("meta_info")
            rid = meta.get("id") if isinstance(meta, dict) else item.get("id")
            if isinstance(rid, str):
                s.set_attribute("gen_ai.response.id", rid)
            if isinstance(item.get("model"), str):
                s.set_attribute("gen_ai.response.model", item["model"])
            reasons = _finish_reasons(item) or [self.stream_finish[i] for i in sorted(self.stream_finish)]
            if reasons:
                s.set_attribute("gen_ai.response.finish_reasons", reasons)
        if prompt is not None:
            s.set_attribute("gen_ai.usage.input_tokens", prompt)
        if completion is not None:
            s.set_attribute("gen_ai.usage.output_tokens", completion)
        if cached is not None:
            s.set_attribute("gen_ai.usage.cache_read.input_tokens", cached)
            s.set_attribute("inferctl.cache.actual_tokens", cached)
            # the explicit flag: the worker reused a cached prefix (SGLang's cached_tokens > 0)
            s.set_attribute("inferctl.cache.prefix_match", cached > 0)
        s.set_attribute("inferctl.cache.predicted_tokens", predicted_tokens)
        s.set_attribute("inferctl.cache.predicted_match", predicted_tokens > 0)
        if not spec and self.stream_ext is not None:
            spec = fields_of(self.stream_ext)
        cost = self.facts.cost_ratio if self.facts is not None else 0.1
        for key, value in spec_attributes(spec, cost).items():
            s.set_attribute(key, value)

    def chunk(self, events: list[bytes]) -> None:
        """The relay received these SSE events (one read). A read with content is one arrival for the ITL;
        the stream's tail (the `sglext` and usage chunks, empty `choices`, and [DONE]) is not."""
        content = False
        for ev in events:
            if b'"sglext"' in ev:
                obj = event_json(ev)
                if isinstance(obj, dict) and isinstance(obj.get("sglext"), dict):
                    self.stream_ext = obj
            elif b"[DONE]" not in ev and b'"choices":[]' not in ev and b'"choices": []' not in ev:
                content = True
                if b'"finish_reason":"' in ev or b'"finish_reason": "' in ev:
                    self._finished(event_json(ev))
        if content and len(self.chunk_times) <= MAX_GAPS:
            self.chunk_times.append(time.monotonic())

    def streamed(self, ttft_s: float, first: float, last: float, completion: int | None) -> None:
        """A streamed answer: time to first chunk, and the mean gap per output token after the first
        (time per output token, TPOT: (last chunk - first chunk) / (output tokens - 1))."""
        self.span.set_attribute("gen_ai.response.time_to_first_chunk", ttft_s)
        self.span.set_attribute("inferctl.ttft_s", ttft_s)
        if completion and completion > 1 and last > first:
            self.span.set_attribute("inferctl.mean_itl_s", (last - first) / (completion - 1))

    def finish(self, status: int, ctx: Any) -> None:
        s = self.span
        s.set_attribute("http.response.status_code", status)
        if ctx is not None:
            s.set_attribute("inferctl.attempts", ctx.attempts)
            if ctx.reason:
                s.set_attribute("inferctl.routing.reason", ctx.reason)
            if ctx.prefill:
                s.set_attribute("inferctl.prefill", ctx.prefill)
            if ctx.decode:
                s.set_attribute("inferctl.decode", ctx.decode)
            if getattr(ctx, "named", None) is not None:
                s.set_attribute("inferctl.prefix.name", ctx.named.name)
            self._served(ctx)
        for key, value in itl_attributes(self.chunk_times).items():
            s.set_attribute(key, value)
        if status >= 500:
            s.set_status(self.t.Status(self.t.ERROR, f"HTTP {status}"))
            s.set_attribute("error.type", str(status))
        s.end()

    def _finished(self, obj: Any) -> None:
        choices = obj.get("choices") if isinstance(obj, dict) else None
        for c in choices if isinstance(choices, list) else []:
            if isinstance(c, dict) and isinstance(c.get("finish_reason"), str) and isinstance(c.get("index"), int):
                self.stream_finish[c["index"]] = c["finish_reason"]

    def _served(self, ctx: Any) -> None:
        """The decode's (or collocated worker's) speculation and KV fabric, the pair's last KV transfer."""
        f = self.facts
        worker = ctx.decode or ctx.prefill
        if f is None or not worker:
            return
        spec = f.spec
        attrs = decode_attributes(spec.decodes.get(worker) if spec is not None else None,
                                  spec.fabric.get(worker) if spec is not None else None)
        if ctx.decode and ctx.prefill and f.pairs is not None:
            attrs.update(kv_attributes(f.pairs.health.pairs.get((ctx.prefill, ctx.decode)), f.clock()))
        for key, value in attrs.items():
            self.span.set_attribute(key, value)

    # ---- attempts and calls --------------------------------------------------------------------
    def attempt_start(self, n: int, pre: Any, dec: Any, reason: str, predicted_tokens: int) -> None:
        attrs: dict[str, Any] = {"inferctl.attempt": n, "inferctl.routing.reason": reason,
                                 "inferctl.cache.predicted_tokens": predicted_tokens}
        if dec is not None:
            attrs["inferctl.prefill"], attrs["inferctl.decode"] = pre.url, dec.url
        else:
            attrs["inferctl.worker"] = pre.url
        self.attempt = self.t.tracer.start_span("attempt", context=self.t.in_context(self.span), kind=self.t.INTERNAL,
                                                attributes=attrs)
        self.decode_started_ns = self.prefill_done_ns = None
        self.decode_span = None

    def room(self, room: Any) -> None:
        if self.attempt is not None:
            self.attempt.set_attribute("inferctl.bootstrap_room", room if isinstance(room, int) else str(room))

    def attempt_end(self, failure: Any) -> None:
        a = self.attempt
        if a is None:
            return
        if self.decode_started_ns is not None and self.prefill_done_ns is not None \
                and self.prefill_done_ns >= self.decode_started_ns:
            kv = self.t.tracer.start_span("kv_wait", context=self.t.in_context(self.decode_span or a),
                                          kind=self.t.INTERNAL, start_time=self.decode_started_ns)
            kv.end(end_time=self.prefill_done_ns)
        if failure is not None:
            a.set_attribute("inferctl.retry_cause", failure.cause)
            a.set_status(self.t.Status(self.t.ERROR, failure.message))
        a.end()
        self.attempt = None

    def call_start(self, w: Any, headers: dict[str, str]) -> tuple[Any, dict[str, str]]:
        """The span of one upstream call and the headers that carry its context to the worker."""
        role = {"mixed": "worker"}.get(w.role, w.role)
        parts = urlsplit(w.url)
        span = self.t.tracer.start_span(role, context=self.t.in_context(self.attempt or self.span), kind=self.t.CLIENT,
                                        attributes={"server.address": parts.hostname or "", "server.port": parts.port or 80,
                                                    "url.full": w.url + self.endpoint, "inferctl.role": w.role})
        out = dict(headers)
        self.t.propagator.inject(out, context=self.t.in_context(span))
        if w.role == "decode":
            self.decode_started_ns, self.decode_span = _ns(), span
        return span, out

    def call_end(self, w: Any, span: Any, status: int | None, error: BaseException | None) -> None:
        if status is not None:
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(self.t.Status(self.t.ERROR, f"HTTP {status}"))
        if error is not None:
            span.set_attribute("error.type", type(error).__name__)
            span.set_status(self.t.Status(self.t.ERROR, str(error) or type(error).__name__))
        if w.role == "prefill":
            self.prefill_done_ns = _ns()
        span.end()


def _finish_reasons(item: Mapping[str, Any]) -> list[str]:
    meta = item.get("meta_info")
    if isinstance(meta, dict):
        fr = meta.get("finish_reason")
        t = fr.get("type") if isinstance(fr, dict) else fr
        return [t] if isinstance(t, str) else []
    choices = item.get("choices")
    if isinstance(choices, list):
        return [c["finish_reason"] for c in choices if isinstance(c, dict) and isinstance(c.get("finish_reason"), str)]
    return []
