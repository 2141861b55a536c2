"""The request path's entry point: `Router` owns the router's state, wires the parts together and turns
each outcome into the client's answer.

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
import time
from collections.abc import Callable
from typing import Any

from infer_ctl.core.routing.index import BLOCK_CHARS, PrefixIndex
from infer_ctl.core.routing.pair_health import PairFloor
from infer_ctl.core.routing.pd import parallel_samples, wants_logprobs
from infer_ctl.core.routing.policy import NoWorkerAvailable
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.core.routing.prompt import routing_text
from infer_ctl.router.config import RouterConfig, policy_config
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.pair_health import PairTracker
from infer_ctl.router.fleet.workers import WorkerRegistry
from infer_ctl.router.http import h1, sse
from infer_ctl.router.http.jsonio import DecodeError, error_body, loads
from infer_ctl.router.http.upstream import Upstreams
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.kvindex.kv_subscriber import StreamSettings
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.router.request.admission import Admission
from infer_ctl.router.request.attempt import AttemptRunner
from infer_ctl.router.request.calls import WorkerCalls
from infer_ctl.router.request.coalesce import Coalescer
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.feedback import Feedback
from infer_ctl.router.request.observe import RequestObserver, observing
from infer_ctl.router.request.picker import PairPicker
from infer_ctl.router.request.recovery import StreamRecovery
from infer_ctl.router.request.relay import StreamRelay
from infer_ctl.router.request.retry import RetriesExhausted, with_retries

log = logging.getLogger("infer_ctl.router")

_JSON = "application/json"
Reply = h1.StreamResponse | h1.Response


class Router:
    def __init__(self, cfg: RouterConfig, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.rng = rng or random.Random()
        self.workers = WorkerRegistry(cfg)
        self.index = PrefixIndex(block_chars=BLOCK_CHARS, ttl_s=cfg.settings.prefix_ttl_s,
                                 max_blocks=max(1, cfg.settings.index_max_tokens * 4 // BLOCK_CHARS))
        self.prefixes = PrefixRegistry(rewarm_idle_s=cfg.settings.rewarm_idle_s)
        self.policy = policy_config(cfg.settings)
        self.upstreams = Upstreams()
        self.admission = Admission(cfg.settings.max_concurrent, cfg.settings.max_queue, cfg.settings.queue_timeout_s)
        self.metrics = RouterMetrics(self)
        self.pairs = PairTracker(PairFloor(cfg.settings.pair_health.min_kv_speed_gb_s, cfg.settings.pair_health.max_kv_latency_ms, cfg.settings.pair_health.bad_samples,
                                           cfg.settings.pair_health.max_transfer_failures, cfg.settings.pair_health.probe_after_s), clock)
        self.picker = PairPicker(self.workers, self.index, self.policy, rng=self.rng, clock=clock, metrics=self.metrics,
                                 pairs=self.pairs)
        self.calls = WorkerCalls(self.upstreams, clock=clock, metrics=self.metrics)
        self.spec = SpecStats(window=cfg.spec_window_requests, max_labels=cfg.settings.spec_max_labels, clock=clock)
        self.feedback = Feedback(self.prefixes, clock=clock, metrics=self.metrics, log_requests=cfg.settings.log_requests,
                                 spec=self.spec)
        #: tracing and tenants (observe.py); None with neither configured: the request path then only checks that
        self.observing = observing(cfg, clock=clock, registry=self.metrics.registry, workers=self.workers,
                                   chars_per_token=lambda: self.feedback.chars_per_token, spec=self.spec, pairs=self.pairs)
        # the exact index from the prefills' KV events (router/kvindex/kv_routing.py); the predicted index stays
        # the fallback for every worker whose stream is not trusted
        self.kv = KvRouting(enabled=cfg.settings.kv_events.enabled and cfg.settings.policy == "cache_aware", block_chars=BLOCK_CHARS,
                            tokenizer_path=cfg.tokenizer_path, metrics=self.metrics,
                            settings=StreamSettings(max_blocks=cfg.settings.kv_events.max_blocks,
                                                    max_blocks_per_medium=cfg.settings.kv_events.max_blocks_per_medium,
                                                    replay_timeout_s=cfg.settings.kv_events.replay_timeout_s,
                                                    max_batches_per_s=cfg.settings.kv_events.max_batches_per_s,
                                                    max_message_bytes=cfg.settings.kv_events.max_message_bytes),
                            tier_weights=cfg.tier_weights(), anchor_max_chars=cfg.settings.kv_events.anchor_max_chars)
        self.kv.chars_per_token = lambda: self.feedback.chars_per_token
        self.picker.kv = self.kv
        # in-flight prefix coalescing (router/request/coalesce.py): the pending overlay and the hold
        self.coalesce = Coalescer(cfg.coalesce_config(), block_chars=BLOCK_CHARS,
                                  chars_per_token=lambda: self.feedback.chars_per_token, registry=self.metrics.registry,
                                  max_retries=cfg.settings.max_retries)
        if cfg.settings.coalesce.enabled and cfg.settings.policy == "cache_aware":
            self.picker.pending = self.coalesce.pending
            self.coalesce.kv = self.kv
            self.kv.on_batch = self.coalesce.kv_batch
        self.feedback.kv, self.feedback.index, self.feedback.on_ratio = self.kv, self.index, self._ratio_changed
        relay = StreamRelay(self.calls, self.feedback, clock=clock, metrics=self.metrics)
        self.attempts = AttemptRunner(self.calls, relay, self.feedback, rng=self.rng,
                                      request_timeout_s=cfg.settings.request_timeout_s)
        relay.recovery = StreamRecovery(enabled=cfg.settings.stream_recovery, pick=self.picker.pick,
                                        open_stream=self.attempts.open_stream, upstreams=self.upstreams, rng=self.rng,
                                        metrics=self.metrics, max_tries=1 + cfg.settings.max_retries,
                                        linger=self.attempts.finish_later)
        self._rid_prefix = os.urandom(4).hex()
        self._rid_seq = 0
        self._background: set[asyncio.Task[Any]] = set()
        now = clock()
        for p in cfg.prefixes:
            self.prefixes.register(p.name, p.text, now=now, ttl_s=p.ttl_s, replicas=p.replicas, pin=p.pin, fmt=p.fmt,
                                   keep=p.keep)

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
        return self.feedback.chars_per_token

    def _ratio_changed(self, cpt: float) -> None:
        """The chars-per-token estimate moved: each prefill's index capacity (its KV tokens in index
        characters) follows now, not at the next health check."""
        for w in self.workers.prefill_like():
            if w.max_total_tokens:
                self.index.set_capacity(w.url, int(w.max_total_tokens * cpt / self.index.block_chars))

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
        return h1.Response(status, error_body(status, message), _JSON, headers)

    async def handle(self, request: h1.Request, endpoint: str) -> Reply:
        rid = request.headers.get("x-request-id") or self.new_rid()
        obs: RequestObserver | None = None
        if self.observing is not None:
            obs, denied = self.observing.start(request.headers, endpoint, rid, request.body,
                                               repeated=request.repeated, peer=request.peer)
            if denied is not None:  # a tenant's key or limit (tenants.py): refused before taking a slot
                self.metrics.rejected.labels(f"tenant_{denied.limit}").inc()
                return h1.Response(denied.status, denied.body(), _JSON, {"X-Request-Id": rid, **denied.headers()})
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
            status = resp.status
            return resp
        except (asyncio.CancelledError, ConnectionError):
            # the client went away (nginx's "client closed request", 499): not the router's failure, and
            # no failure at all once its stream's [DONE] was delivered (clients close before the terminator)
            stream = request.stream
            status = 200 if stream is not None and stream.delivered else 499
            raise
        except Exception:
            # A bug must still produce a JSON answer, never a dropped request.
            log.exception("internal error", extra={"rid": rid, "endpoint": endpoint})
            return self.error(endpoint, rid, 500, "internal router error; see the router's log")
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
        try:
            async with asyncio.timeout(cfg.settings.request_timeout_s):
                return await with_retries(ctx, self.picker.pick, attempt,
                                          max_retries=cfg.settings.max_retries, base_s=cfg.settings.retry_base_s, rng=self.rng,
                                          metrics=self.metrics, observe=self.pairs.outcome)
        except NoWorkerAvailable as exc:
            return self.error(endpoint, rid, 503, f"{exc}; check `inferctl router workers`", "no_worker",
                              retry_after_s=exc.retry_after_s)
        except RetriesExhausted as out:
            last = out.last
            if last.status in (408, 429) and last.body:
                return h1.Response(last.status, last.body, _JSON, headers=ctx.headers)  # "later": the worker's own
            detail = f" ({last.body[:200].decode(errors='replace')})" if last.body else ""
            return self.error(endpoint, rid, 502, f"all {out.attempts} attempts failed; last: {last.message}{detail}")
        except TimeoutError:
            if ctx.resp is not None and ctx.resp.prepared:
                with contextlib.suppress(Exception):
                    await ctx.resp.write(sse.error_event(504, "request timed out at the router"))
                    await ctx.resp.write_eof()
                return ctx.resp
            return self.error(endpoint, rid, 504, f"no response within {cfg.settings.request_timeout_s:g}s", "timeout")
