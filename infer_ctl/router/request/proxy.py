"""The request path's entry point: `Router` holds the router's state (its parts, built by
router/daemon/assembly.py) and turns each outcome into the client's answer.

A request goes: admission (admission.py: drain, concurrency limit, queue) -> the body is parsed into a
RequestContext (context.py) -> attempts under the request timeout (retry.py), each on a pair chosen
by picker.py and run by attempt.py (PD or collocated; streams relayed by relay.py), the upstream calls
accounted per worker by calls.py -> what the answer taught the router (feedback.py). Every error the
router itself makes is a JSON document (`error`), counted and logged; a bug still gets a JSON 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Callable
from typing import Any

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.pd import parallel_samples, wants_logprobs
from infer_ctl.core.routing.policy import NoWorkerAvailable, PolicyConfig
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.core.routing.prompt import routing_text
from infer_ctl.core.routing.retry import pass_on_answer
from infer_ctl.router.config import RouterConfig
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.pair_health import PairTracker
from infer_ctl.router.fleet.workers import WorkerRegistry
from infer_ctl.router.http import h1, sse
from infer_ctl.router.http.jsonio import JSON_TYPE, DecodeError, error_body, loads
from infer_ctl.router.http.upstream import Upstreams
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.router.request.admission import Admission
from infer_ctl.router.request.attempt import AttemptRunner
from infer_ctl.router.request.calls import WorkerCalls
from infer_ctl.router.request.coalesce import Coalescer
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.feedback import Feedback, TokenRatio
from infer_ctl.router.request.observe import Observing, RequestObserver
from infer_ctl.router.request.picker import PairPicker
from infer_ctl.router.request.retry import RetriesExhausted, with_retries

log = logging.getLogger("infer_ctl.router")

Reply = h1.StreamResponse | h1.Response


def index_follows_ratio(workers: WorkerRegistry, index: PrefixIndex) -> Callable[[float], None]:
    """What a moved chars-per-token estimate changes (feedback.TokenRatio `on_change`): each prefill's index
    capacity (its KV tokens in index characters) follows now, not at the next health check."""
    def changed(cpt: float) -> None:
        for w in workers.prefill_like():
            if w.max_total_tokens:
                index.set_capacity(w.url, int(w.max_total_tokens * cpt / index.block_chars))
    return changed


class Router:
    """The request path's state and entry point. Its parts come built, each with its collaborators
    (router/daemon/assembly.py `build_router`)."""

    def __init__(self, cfg: RouterConfig, *, clock: Callable[[], float], rng: random.Random,
                 workers: WorkerRegistry, index: PrefixIndex, prefixes: PrefixRegistry, policy: PolicyConfig,
                 upstreams: Upstreams, admission: Admission, metrics: RouterMetrics, pairs: PairTracker,
                 picker: PairPicker, calls: WorkerCalls, spec: SpecStats, ratio: TokenRatio, feedback: Feedback,
                 observing: Observing | None, kv: KvRouting, coalesce: Coalescer, attempts: AttemptRunner) -> None:
        self.cfg = cfg
        self.clock = clock
        self.rng = rng
        self.workers = workers
        self.index = index
        self.prefixes = prefixes
        self.policy = policy
        self.upstreams = upstreams
        self.admission = admission
        self.metrics = metrics
        self.pairs = pairs
        self.picker = picker
        self.calls = calls
        self.spec = spec
        self.ratio = ratio
        self.feedback = feedback
        #: tracing and tenants (observe.py); None with neither configured: the request path then only checks that
        self.observing = observing
        #: the exact index from the prefills' KV events (router/kvindex/kv_routing.py); the predicted index stays
        #: the fallback for every worker whose stream is not trusted
        self.kv = kv
        #: in-flight prefix coalescing (router/request/coalesce.py): the pending overlay and the hold; on when
        #: the picker reads its overlay (`picker.pending`)
        self.coalesce = coalesce
        self.attempts = attempts
        self._rid_prefix = os.urandom(4).hex()
        self._rid_seq = 0
        self._background: set[asyncio.Task[Any]] = set()

    # ---- state read by the server, health checks, warmer, admin API and metrics -------------------
    @property
    def mode(self) -> str:
        return "pd" if self.workers.role("prefill", "decode") else "collocated"

    @property
    def active(self) -> int:
        return self.admission.active

    @property
    def waiting(self) -> int:
        return self.admission.waiting

    @property
    def draining(self) -> bool:
        return self.admission.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.admission.draining = value

    @property
    def chars_per_token(self) -> float:
        return self.ratio.value

    def new_rid(self) -> str:
        self._rid_seq += 1
        return f"{self._rid_prefix}-{self._rid_seq:x}"

    # ---- background tasks (health checks, warm-ups) ------------------------------------------------
    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("background task failed: %s", task.exception())

    def cancel_background(self) -> None:
        for task in list(self._background):
            task.cancel()

    # ---- the request path --------------------------------------------------------------------------
    def error(self, endpoint: str, rid: str, status: int, message: str,
              reason: str | None = None, retry_after_s: int | None = None) -> h1.Response:
        """An error the router itself answers; `reason` counts it in rejected_total."""
        if reason:
            self.metrics.rejected.labels(reason).inc()
        log.log(logging.WARNING if status >= 500 else logging.INFO, "request failed",
                extra={"rid": rid, "endpoint": endpoint, "status": status, "error": message})
        headers = {"X-Request-Id": rid}
        if retry_after_s is not None:  # RFC 9110 §10.2.3: the OpenAI SDK, among others, waits that long before it retries
            headers["Retry-After"] = str(retry_after_s)
        return h1.Response(status, error_body(status, message), JSON_TYPE, headers)

    async def handle(self, request: h1.Request, endpoint: str) -> Reply:
        rid = request.headers.get("x-request-id") or self.new_rid()
        obs: RequestObserver | None = None
        if self.observing is not None:
            obs, denied = self.observing.start(request.headers, endpoint, rid, request.body,
                                               repeated=request.repeated, peer=request.peer)
            if denied is not None:  # a tenant's key or limit (tenants.py): refused before taking a slot
                self.metrics.rejected.labels(f"tenant_{denied.limit}").inc()
                return h1.Response(denied.status, denied.body(), JSON_TYPE, {"X-Request-Id": rid, **denied.headers()})
        try:
            refusal = await self.admission.enter()
        except asyncio.CancelledError:  # the client went away in the queue: its tenant slot and span end here
            if obs is not None:
                obs.finish(499)
            raise
        if refusal is not None:
            if obs is not None:
                obs.finish(refusal.status)
            return self.error(endpoint, rid, refusal.status, refusal.message, refusal.reason)
        t0 = self.clock()
        status = 500
        try:
            resp = await self._handle(request, endpoint, rid, t0, obs)
            status = resp.outcome if isinstance(resp, h1.StreamResponse) and resp.outcome else resp.status
            return resp
        except (asyncio.CancelledError, ConnectionError):
            # the client went away (nginx's "client closed request", 499): not the router's failure, and
            # no failure at all once its stream's [DONE] was delivered (clients close before the terminator),
            # nor the client's once the stream ended in the router's error event (`outcome`: the worker's
            # stream broke first; the client closed as that event went out)
            stream = request.stream
            status = 499 if stream is None else 200 if stream.delivered else stream.outcome or 499
            raise
        except Exception:
            # A bug must still produce a JSON answer, never a dropped request: after a stream's head
            # (relay.py `send_head`, or mid-stream) that answer is the stream's error event
            log.exception("internal error", extra={"rid": rid, "endpoint": endpoint})
            return await committed(request.stream, self.error(endpoint, rid, 500, "internal router error; see the router's log"))
        finally:
            self.admission.leave()
            self.metrics.observe_request(endpoint, status, self.clock() - t0)
            if obs is not None:
                obs.finish(status)

    async def _handle(self, request: h1.Request, endpoint: str, rid: str, t0: float,
                      obs: RequestObserver | None = None) -> Reply:
        cfg = self.cfg
        if request.too_large:  # known from Content-Length (or the chunks so far): the body was not read
            return self.error(endpoint, rid, 413, f"request body over {cfg.settings.max_body_bytes} bytes", "too_large")
        raw = request.body
        try:
            body = loads(raw)
        except (DecodeError, ValueError, UnicodeDecodeError) as exc:
            return self.error(endpoint, rid, 400, f"malformed JSON body: {exc}", "bad_json")
        if not isinstance(body, dict):
            return self.error(endpoint, rid, 400, "the body must be a JSON object", "bad_json")
        if obs is not None:
            raw = obs.rewrite(endpoint, body, raw)  # the tenant's priority (and stream usage), when it has one
        if self.mode == "pd" and (n := parallel_samples(body)) > 1:
            # SGLang 0.5.23 gives every sample of a prompt the same bootstrap room (docs/router.md, Limits):
            # on a PD pair that fails the transfer; refused now instead of retried into a 500
            return self.error(endpoint, rid, 400, f"n = {n}: parallel sampling (n > 1) is not supported over "
                              "prefill/decode disaggregation (SGLang gives every sample one bootstrap room); send "
                              "n = 1 requests in parallel", "pd_parallel_sampling")
        text = routing_text(endpoint, body)
        ctx = RequestContext(
            rid=rid, endpoint=endpoint, request=request, raw=raw, body=body, stream=bool(body.get("stream")), text=text,
            hashes=self.index.hashes(text) if self.policy.policy == "cache_aware" else [],
            named=self.prefixes.match(text) if text else None, logprobs=wants_logprobs(body), started=t0,
            headers={"X-Request-Id": rid},
        )
        attempts: Any = self.attempts
        if obs is not None:
            ctx.obs = obs
            obs.started(ctx)
            attempts = obs.attempts(attempts)  # an attempt span around each attempt, with tracing
        attempt = attempts.stream if ctx.stream else attempts.unary
        if self.picker.pending is not None and ctx.hashes:
            attempt = self.coalesce.wrap(attempt)
        reply: Reply
        try:
            async with asyncio.timeout(cfg.settings.request_timeout_s):
                reply = await with_retries(ctx, self.picker.pick, attempt,
                                           max_retries=cfg.settings.max_retries, base_s=cfg.settings.retry_base_s, rng=self.rng,
                                           metrics=self.metrics, observe=self.pairs.outcome)
        except NoWorkerAvailable as exc:
            reply = self.error(endpoint, rid, 503, f"{exc}; check `inferctl router workers`", "no_worker",
                               retry_after_s=exc.retry_after_s)
        except RetriesExhausted as out:
            last = out.last
            if last.status is not None and pass_on_answer(last.status, last.body):
                reply = h1.Response(last.status, last.body, JSON_TYPE, headers=ctx.headers)  # "later": the worker's own
            else:
                detail = f" ({last.body[:200].decode(errors='replace')})" if last.body else ""
                reply = self.error(endpoint, rid, 502, f"all {out.attempts} attempts failed; last: {last.message}{detail}")
        except TimeoutError:
            # cut mid-stream: its error event. Nothing streamed yet (only the head went out, `send_head`):
            # it failed as a whole, as without the head - the same 504, its log line and rejected count
            # (`committed` turns it into the stream's error event)
            # Once its [DONE] went out (`delivered`: only the worker's end of response was late) the client
            # has the whole answer: a success, as a break after [DONE] is (relay.py), with no error event;
            # nor a second one after the relay's own (`outcome`: its 502 waited on a backed-up client)
            if ctx.resp is not None and ctx.resp.prepared and ctx.resp.body_started:
                with contextlib.suppress(Exception):
                    if not ctx.resp.delivered and ctx.resp.outcome is None:
                        ctx.resp.outcome = 504  # counted, logged and traced as the 504 its error event says
                        log.warning("request failed", extra={"rid": rid, "endpoint": endpoint, "status": 504,
                                                             "error": "request timed out after its stream began"})
                        await ctx.resp.write(sse.error_event(504, "request timed out at the router"))
                    await ctx.resp.write_eof()
                return ctx.resp
            reply = self.error(endpoint, rid, 504, f"no response within {cfg.settings.request_timeout_s:g}s", "timeout")
        return await committed(ctx.resp, reply)


async def committed(resp: h1.StreamResponse | None, reply: Reply) -> Reply:
    """The answer as the client can still get it: once a stream's head went out (`resp`: relay.py
    `send_head` before the first token, or a stream a bug interrupted) an error answer ends that stream
    as an error event with its status and message (SGLang's own way for a stream that fails), never a
    second head."""
    if resp is None or not resp.prepared or reply is resp:
        return reply
    assert isinstance(reply, h1.Response)
    resp.outcome = reply.status
    with contextlib.suppress(Exception):  # the client may be gone: the answer is what it is
        await resp.write(sse.error_event(reply.status, sse.error_message(reply.body)))
        await resp.write_eof()
    return resp
