"""Per-request hooks of tracing (tracing.py) and tenants (tenants.py), behind one object.

A router with neither configured has no `Observing` and its requests no observer: every hook on the
request path is one `if ctx.obs is not None` (proxy.py, attempt.py, relay.py, feedback.py). With either,
the observer of a request
- resolves and admits its tenant (before the router's own admission), rewrites its body for the tenant
  (the tenant's `priority`; `stream_options.include_usage` on OpenAI streams, so that streamed tokens are
  counted too), drops the named prefix a tenant may not use;
- wraps the request's upstream calls (`calls`: the same signatures as WorkerCalls.read/open/done) with
  a span each and the worker's share clock, and its attempts with an attempt span;
- records what the answer reported (tokens, speculative fields), the stream's timing and the outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from infer_ctl.core.routing.spec_fields import OPENAI_REQUEST_FLAG
from infer_ctl.core.routing.units import chars_to_tokens, ratio
from infer_ctl.core.tenancy.estimate import request_estimate
from infer_ctl.router.http.jsonio import DecodeError, dumps, loads
from infer_ctl.router.observe.spec_stats import fields_of
from infer_ctl.router.observe.tenants import Tenancy, TenantRefusal, TenantState
from infer_ctl.router.request.retry import AttemptFailed
from infer_ctl.router.request.usage import usage_totals

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from infer_ctl.router.config import RouterConfig
    from infer_ctl.router.fleet.workers import WorkerRegistry, WorkerState
    from infer_ctl.router.http.upstream import Response
    from infer_ctl.router.observe.tracing import RequestTrace, Tracing
    from infer_ctl.router.request.calls import WorkerCalls
    from infer_ctl.router.request.context import Done, Open, Read, RequestContext

_OPENAI = frozenset({"/v1/completions", "/v1/chat/completions"})


def observing(cfg: RouterConfig, *, clock: Callable[[], float], registry: CollectorRegistry, workers: WorkerRegistry,
              chars_per_token: Callable[[], float], spec: Any = None, pairs: Any = None) -> Observing | None:
    """The router's tracing and tenants, or None when it has neither (tenants, pricing, tracing)."""
    tenancy = None
    if cfg.tenants or cfg.worker_usd_per_s:
        tenancy = Tenancy(cfg.tenants, header=cfg.settings.tenant_header, worker_usd_per_s=cfg.worker_usd_per_s, clock=clock,
                          registry=registry, worker_roles=lambda: {w.url: w.role for w in workers.all()},
                          trusted_proxies=[str(n) for n in cfg.settings.tenant_trusted_proxies])
    tracing = None
    if cfg.tracing is not None:
        from infer_ctl.router.observe.tracing import (  # imports the OpenTelemetry SDK: only when configured
            ServingFacts,
            Tracing,
        )

        # with what the spans name of the serving workers (the decodes' /server_info, the pairs' KV transfers)
        tracing = Tracing(cfg.tracing, ServingFacts(spec, pairs, cfg.spec_cost_ratio, clock))
    if tenancy is None and tracing is None:
        return None
    return Observing(tenancy, tracing, model_name=cfg.model_name, chars_per_token=chars_per_token)


class _TracedAttempts:
    __slots__ = ("stream", "unary")

    def __init__(self, unary: Any, stream: Any) -> None:
        self.unary, self.stream = unary, stream


class Observing:
    """The router's tracing and tenants; `start` makes a request's observer."""

    def __init__(self, tenancy: Tenancy | None, tracing: Tracing | None, *, model_name: str | None,
                 chars_per_token: Callable[[], float]) -> None:
        self.tenancy = tenancy
        self.tracing = tracing
        self.model_name = model_name
        self.chars_per_token = chars_per_token
        self.priced = bool(tenancy is not None and tenancy.worker_usd_per_s)

    async def close(self) -> None:
        """Flush and stop the exporter (off the event loop: the SDK's shutdown blocks)."""
        if self.tracing is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.shutdown)

    def start(self, headers: Mapping[str, str], endpoint: str, rid: str, body: bytes = b"", *,
              repeated: Collection[str] = (), peer: str | None = None) -> tuple[RequestObserver | None, TenantRefusal | None]:
        """`repeated`, `peer`: the header names sent more than once and the client's address (tenants.py)."""
        tenant, reserved, prompt = None, 0, None
        if self.tenancy is not None:
            tenant, refusal = self.tenancy.admit(headers, repeated, peer)
            if refusal is not None:
                return None, refusal
            if tenant is not None and tenant.tpm is not None:
                # tokens_per_min: reserve the estimate in the admission's step (tenants.py); the body is
                # parsed here only for such tenants (and again by the proxy: the reservation cannot wait)
                try:
                    doc = loads(body) if body else None
                except (DecodeError, ValueError, UnicodeDecodeError):
                    doc = None  # answered 400 by the proxy: nothing reaches a worker, all is given back
                prompt, completion = request_estimate(endpoint, doc, ratio(self.chars_per_token()))
                reserved = self.tenancy.reserve(tenant, prompt + completion)
        trace = self.tracing.request(headers, endpoint, rid) if self.tracing is not None else None
        obs = RequestObserver(self, tenant, trace)
        obs.reserved, obs.prompt_est = reserved, prompt
        return obs, None


class RequestObserver:
    __slots__ = ("_calls", "_open", "completion", "ctx", "o", "prompt_est", "reported", "reserved", "sent",
                 "stream_events", "stream_meta", "tenant", "trace")

    def __init__(self, o: Observing, tenant: TenantState | None, trace: RequestTrace | None) -> None:
        self.o = o
        self.tenant = tenant
        self.trace = trace
        self.ctx: RequestContext | None = None
        self.completion: int | None = None
        self._calls: tuple[Read, Open, Done] | None = None
        self._open: dict[int, tuple[Any, float, Any]] = {}
        #: tokens_per_min: reserved at admission, reported by the answers (None: no answer reported),
        #: and whether any call reached a worker (tenants.py, settle)
        self.reserved = 0
        self.reported: int | None = None
        self.sent = False
        #: tokens_per_min only (None otherwise: nothing is counted): the prompt's estimate, and what the
        #: relay saw of a stream's completion so far (`stream_chunk`), for a stream that ends unreported
        self.prompt_est: int | None = None
        self.stream_events = 0
        self.stream_meta: int | None = None

    # ---- the request ---------------------------------------------------------------------------
    def rewrite(self, endpoint: str, body: dict[str, Any], raw: bytes) -> bytes:
        """The body to send for this tenant (`body` is changed in place; `raw` re-serialised only then)."""
        spec = self.tenant.spec if self.tenant is not None else None
        tenants = spec is not None and self.o.tenancy is not None and not self.o.tenancy.anonymous
        if not tenants and self.trace is None:
            return raw
        changed = False
        if spec is not None and tenants and spec.priority is not None and body.get("priority") != spec.priority:
            body["priority"] = spec.priority  # the tenant's, never the client's own claim
            changed = True
        if self.trace is not None and endpoint in _OPENAI and OPENAI_REQUEST_FLAG not in body:
            # SGLang reports an OpenAI answer's speculative fields only when asked (sglext.spec_tokens_details;
            # /generate's meta_info always has them): the span's spec attributes need them
            body[OPENAI_REQUEST_FLAG] = True
            changed = True
        if endpoint in _OPENAI and body.get("stream"):
            so = body.get("stream_options")
            if not (isinstance(so, dict) and so.get("include_usage")):
                body["stream_options"] = {**(so if isinstance(so, dict) else {}), "include_usage": True}
                changed = True
        return dumps(body) if changed else raw

    def started(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        tenant = self.tenant
        if tenant is not None and ctx.named is not None and tenant.spec.prefixes is not None \
                and ctx.named.name not in tenant.spec.prefixes:
            ctx.named = None  # routed as a plain prompt: no warm replicas, not in the prefix's statistics
        if self.trace is not None:
            self.trace.describe(ctx.body, self.o.model_name, tenant.name if tenant is not None else None)

    def finish(self, status: int) -> None:
        if self.tenant is not None and self.o.tenancy is not None:
            # no report: a request that reached a worker keeps its reservation, one that did not gets it
            # back, and so does one a worker refused (a 4xx other than the client's own 499: SGLang
            # validates before it computes, e.g. a max_tokens over the context, which would otherwise
            # have charged that max_tokens in full)
            refused = 400 <= status < 500 and status != 499
            if self.reported is not None:
                used = self.reported  # the answer's own usage, charged once (the counts below are unused)
            elif self.sent and not refused:
                # a stream cancelled or broken before its usage: its reservation, or what it streamed when
                # more (a chat request without max tokens reserved its prompt only: the tokens streamed
                # before a cancel were free)
                used = max(self.reserved, (self.prompt_est or 0) + self.streamed_tokens())
            else:
                used = 0
            self.o.tenancy.settle(self.tenant, self.reserved, used)
            self.o.tenancy.leave(self.tenant, status)
        if self.trace is not None:
            self.trace.finish(status, self.ctx)

    # ---- what the answer taught ----------------------------------------------------------------
    def answered(self, ctx: RequestContext, obj: Any, predicted_tokens: int) -> None:
        """A successful answer (feedback.py): `predicted_tokens` cached where it was routed."""
        prompt, cached, completion = usage_totals(obj)
        self.completion = completion
        if self.tenant is not None and self.o.tenancy is not None:
            self.o.tenancy.used(self.tenant, prompt, cached, completion)
            self.reported = (self.reported or 0) + prompt + completion
        if self.trace is not None:
            self.trace.answered(obj, prompt, cached, completion, predicted_tokens, fields_of(obj))

    def stream_chunk(self, events: list[bytes], last: Any, items: dict[int, Any] | None) -> None:
        """The relay forwarded `events` SSE events, the last JSON one `last` (`items`: a /generate batch's
        latest chunk per prompt). Traced: their arrival (ITL) and an OpenAI stream's `sglext` event.
        Counted only for a tokens_per_min tenant; see `streamed_tokens`."""
        if self.trace is not None:
            self.trace.chunk(events)
        if self.prompt_est is None:
            return
        self.stream_events += len(events)
        if items:
            self.stream_meta = sum(_completion_of(o) for o in items.values())
        elif isinstance(last, dict) and isinstance(last.get("meta_info"), dict):
            self.stream_meta = _completion_of(last)

    def streamed_tokens(self) -> int:
        """The completion tokens a stream delivered so far. /generate streams: SGLang's own running count,
        meta_info.completion_tokens of each prompt's latest chunk (exact). OpenAI streams (no running
        count before the final usage chunk): the number of events, since each content delta carries one
        or more tokens (SGLang 0.5.23 entrypoints/openai/serving_chat.py: a role-only first event per
        choice, then one delta per output the tokenizer manager yields); the role and finish events add at
        most two per choice, a delta of several tokens counts one - an estimate, not the usage."""
        return self.stream_meta if self.stream_meta is not None else self.stream_events

    def first_chunk(self, ttft_s: float) -> None:
        if self.tenant is not None:
            self.tenant.ttft.observe(ttft_s)

    def streamed(self, ttft_s: float, first: float, last: float) -> None:
        if self.trace is not None:
            self.trace.streamed(ttft_s, first, last, self.completion)

    def recovery(self, outcome: str, reason: str | None, tokens_sent: int) -> None:
        """Mid-stream recovery (recovery.py) ended a broken stream this way: an event on the request's span."""
        if self.trace is not None:
            attrs: dict[str, Any] = {"inferctl.recovery.outcome": outcome, "inferctl.recovery.tokens_sent": tokens_sent}
            if reason:
                attrs["inferctl.recovery.reason"] = reason
            self.trace.span.add_event("stream_recovery", attrs)

    def room(self, room: Any) -> None:
        if self.trace is not None:
            self.trace.room(room)

    # ---- attempts ------------------------------------------------------------------------------
    def attempts(self, runner: Any) -> Any:
        """The AttemptRunner, or (with tracing) a stand-in whose unary/stream put a span around each attempt."""
        if self.trace is None:
            return runner
        return _TracedAttempts(self._traced(runner.unary), self._traced(runner.stream))

    def _traced(self, run: Callable[[RequestContext, WorkerState, WorkerState | None], Awaitable[Any]]) -> Any:
        trace = self.trace
        assert trace is not None
        cpt = self.o.chars_per_token

        async def traced(ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> Any:
            trace.attempt_start(ctx.attempts, pre, dec, ctx.reason, chars_to_tokens(ctx.predicted_chars, ratio(cpt())))
            failure: AttemptFailed | None = None
            try:
                return await run(ctx, pre, dec)
            except AttemptFailed as exc:
                failure = exc
                raise
            finally:
                trace.attempt_end(failure)

        return traced

    # ---- upstream calls ------------------------------------------------------------------------
    def calls(self, calls: WorkerCalls) -> tuple[Read, Open, Done]:
        """read, open and done with the same signatures as WorkerCalls', each call inside a span and the
        worker's share clock."""
        if self._calls is None:
            self._calls = (self._reader(calls), self._opener(calls), self._closer(calls))
        return self._calls

    def _begin(self, w: WorkerState, headers: dict[str, str]) -> tuple[float, Any, dict[str, str]]:
        self.sent = True
        mark = self.o.tenancy.enter(w.url) if self.o.priced and self.o.tenancy is not None else 0.0
        span = None
        if self.trace is not None:
            span, headers = self.trace.call_start(w, headers)
        return mark, span, headers

    def _end(self, w: WorkerState, mark: float, span: Any, status: int | None, error: BaseException | None) -> None:
        tenancy = self.o.tenancy
        if self.o.priced and tenancy is not None and self.tenant is not None:
            tenancy.leave_worker(self.tenant, w.url, w.role, mark)
        if span is not None and self.trace is not None:
            self.trace.call_end(w, span, status, error)

    def _reader(self, calls: WorkerCalls) -> Any:
        async def read(w: WorkerState, path: str, payload: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
            mark, span, headers = self._begin(w, headers)
            status, error = None, None
            try:
                answer = await calls.read(w, path, payload, headers)
                status = answer[0]
                return answer
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._end(w, mark, span, status, error)

        return read

    def _opener(self, calls: WorkerCalls) -> Any:
        async def open_(w: WorkerState, path: str, payload: bytes, headers: dict[str, str]) -> Response:
            mark, span, headers = self._begin(w, headers)
            try:
                resp = await calls.open(w, path, payload, headers)
            except BaseException as exc:
                self._end(w, mark, span, None, exc)
                raise
            self._open[id(resp)] = (mark, span, resp)
            return resp

        return open_

    def _closer(self, calls: WorkerCalls) -> Any:
        def done(w: WorkerState, resp: Response) -> None:
            calls.done(w, resp)
            held = self._open.pop(id(resp), None)
            if held is not None:
                self._end(w, held[0], held[1], resp.status, None)

        return done


def _completion_of(obj: Any) -> int:
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    n = meta.get("completion_tokens") if isinstance(meta, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0
