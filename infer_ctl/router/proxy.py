"""The request path: admission, routing, the PD (or collocated) upstream calls, retries and relaying.

PD: the same body, with bootstrap fields, goes to the chosen prefill and decode concurrently. The client
gets the decode's response. A prefill that fails before the decode answered fails the attempt at once
(the decode would otherwise wait for a KV transfer that never comes). A failed attempt - transport
error, 5xx or 429 from a worker, or a stream that ended before its first byte - is retried on a new
pair with a new bootstrap room after a jittered backoff, at most `max_retries` times. Nothing is
retried once a byte went to the client; a stream that breaks after that ends with an error event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.routing.breaker import backoff_s
from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.pd import (
    batch_size,
    bootstrap_host,
    merge_input_logprobs,
    new_room,
    wants_logprobs,
    with_bootstrap,
)
from infer_ctl.core.routing.policy import NoWorkerAvailable, PolicyConfig, choose_decode, choose_prefill
from infer_ctl.core.routing.prefixes import PrefixRecord, PrefixRegistry
from infer_ctl.core.routing.prompt import routing_text
from infer_ctl.router import h1, sse
from infer_ctl.router.config import RouterConfig
from infer_ctl.router.jsonio import DecodeError, dumps, error_body, loads
from infer_ctl.router.metrics import RouterMetrics
from infer_ctl.router.upstream import Response, UpstreamError, Upstreams
from infer_ctl.router.usage import token_counts
from infer_ctl.router.workers import WorkerRegistry, WorkerState

log = logging.getLogger("infer_ctl.router")

_JSON = "application/json"
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_PD_KEYS = frozenset({"bootstrap_host", "bootstrap_port", "bootstrap_room"})


class _Retryable(Exception):
    def __init__(self, cause: str, worker: str, message: str, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.cause, self.worker, self.message, self.status, self.body = cause, worker, message, status, body


@dataclass
class _Ctx:
    rid: str
    endpoint: str
    body: dict[str, Any]
    raw: bytes
    stream: bool
    text: str
    hashes: list[int]
    named: PrefixRecord | None
    logprobs: bool
    started: float
    headers: dict[str, str]
    predicted_chars: int = 0
    reason: str = ""
    prefill: str = ""
    decode: str = ""
    attempts: int = 0
    resp: h1.StreamResponse | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Router:
    def __init__(self, cfg: RouterConfig, *, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.rng = rng or random.Random()
        self.workers = WorkerRegistry(cfg)
        self.index = PrefixIndex(block_chars=cfg.block_chars, ttl_s=cfg.prefix_ttl_s,
                                 max_blocks=max(1, cfg.index_max_tokens * 4 // cfg.block_chars))
        self.prefixes = PrefixRegistry(rewarm_idle_s=cfg.rewarm_idle_s)
        self.policy = PolicyConfig(policy=cfg.policy, cache_threshold=cfg.cache_threshold,
                                   balance_abs=cfg.balance_abs, balance_rel=cfg.balance_rel)
        self.upstreams = Upstreams()
        self.metrics = RouterMetrics(self)
        self.slots = asyncio.Semaphore(cfg.max_concurrent)
        self.active = 0
        self.waiting = 0
        self.draining = False
        self.seq = 0
        #: learned from responses (prompt chars / prompt tokens): converts index characters to tokens
        self.chars_per_token = 4.0
        self._rid_prefix = os.urandom(4).hex()
        self._rid_seq = 0
        self._background: set[asyncio.Task[Any]] = set()
        self.suspect: Callable[[WorkerState], None] = lambda w: None
        now = clock()
        for p in cfg.prefixes:
            self.prefixes.register(p.name, p.text, now=now, ttl_s=p.ttl_s, replicas=p.replicas, pin=p.pin, fmt=p.fmt)

    @property
    def mode(self) -> str:
        return "pd" if self.workers.role("prefill", "decode") else "collocated"

    # ---- helpers ---------------------------------------------------------------------------------
    def new_rid(self) -> str:
        self._rid_seq += 1
        return f"{self._rid_prefix}-{self._rid_seq:x}"

    def error(self, ctx_or_endpoint: _Ctx | str, status: int, message: str, kind: str, rid: str = "",
              reason: str | None = None) -> h1.Response:
        endpoint = ctx_or_endpoint.endpoint if isinstance(ctx_or_endpoint, _Ctx) else ctx_or_endpoint
        rid = ctx_or_endpoint.rid if isinstance(ctx_or_endpoint, _Ctx) else rid
        if reason:
            self.metrics.rejected.labels(reason).inc()
        log.log(logging.WARNING if status >= 500 else logging.INFO, "request failed",
                extra={"rid": rid, "endpoint": endpoint, "status": status, "error": message})
        return h1.Response(status, error_body(status, message, kind), _JSON, {"X-Request-Id": rid})

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._reap)
        return task

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("background task failed: %s", task.exception())

    # ---- entry point -----------------------------------------------------------------------------
    async def handle(self, request: h1.Request, endpoint: str) -> h1.StreamResponse | h1.Response:
        rid = request.headers.get("x-request-id") or self.new_rid()
        if self.draining:
            return self.error(endpoint, 503, "router is shutting down; retry on another router", "unavailable", rid, "draining")
        if self.slots.locked():
            if self.waiting >= self.cfg.max_queue:
                return self.error(endpoint, 429, "too many concurrent requests; retry later", "rate_limited", rid, "overloaded")
            self.waiting += 1
            try:
                await asyncio.wait_for(self.slots.acquire(), self.cfg.queue_timeout_s)
            except TimeoutError:
                return self.error(endpoint, 429, "queued too long waiting for a slot; retry later", "rate_limited", rid, "queue_timeout")
            finally:
                self.waiting -= 1
        else:
            await self.slots.acquire()
        self.active += 1
        t0 = self.clock()
        status = 500
        try:
            resp = await self._handle(request, endpoint, rid, t0)
            status = resp.status
            return resp
        except (asyncio.CancelledError, ConnectionError):
            status = 499  # the client went away (nginx's "client closed request"): not the router's failure
            raise
        except Exception:
            # A bug must still produce a JSON answer, never a dropped request.
            log.exception("internal error", extra={"rid": rid, "endpoint": endpoint})
            return self.error(endpoint, 500, "internal router error; see the router's log", "internal_error", rid)
        finally:
            self.active -= 1
            self.slots.release()
            self.metrics.observe_request(endpoint, status, self.clock() - t0)

    async def _handle(self, request: h1.Request, endpoint: str, rid: str, t0: float) -> h1.StreamResponse | h1.Response:
        cfg = self.cfg
        if request.too_large:  # known from Content-Length (or the chunks so far): the body was not read
            return self.error(endpoint, 413, f"request body over {cfg.max_body_bytes} bytes", "request_too_large", rid, "too_large")
        raw = request.body
        try:
            body = loads(raw)
        except (DecodeError, ValueError, UnicodeDecodeError) as exc:
            return self.error(endpoint, 400, f"malformed JSON body: {exc}", "invalid_request", rid, "bad_json")
        if not isinstance(body, dict):
            return self.error(endpoint, 400, "the body must be a JSON object", "invalid_request", rid, "bad_json")
        text = routing_text(endpoint, body)
        ctx = _Ctx(
            rid=rid, raw=raw, endpoint=endpoint, body=body, stream=bool(body.get("stream")), text=text,
            hashes=self.index.hashes(text) if self.policy.policy == "cache_aware" else [],
            named=self.prefixes.match(text) if text else None, logprobs=wants_logprobs(body), started=t0,
            headers={"X-Request-Id": rid},
        )
        excluded: set[str] = set()
        last: _Retryable | None = None
        try:
            async with asyncio.timeout(cfg.request_timeout_s):
                for attempt in range(1 + cfg.max_retries):
                    if attempt:
                        self.metrics.retries.labels(last.cause if last else "unknown").inc()
                        await asyncio.sleep(backoff_s(attempt, self.rng.random(), base_s=cfg.retry_base_s))
                    try:
                        pre, dec = self._pick(ctx, excluded)
                    except NoWorkerAvailable as exc:
                        if last is not None:
                            break
                        return self.error(ctx, 503, f"{exc}; check `inferctl router workers`", "unavailable", reason="no_worker")
                    ctx.attempts = attempt + 1
                    try:
                        if ctx.stream:
                            return await self._stream(request, ctx, pre, dec)
                        return await self._unary(ctx, pre, dec)
                    except _Retryable as failure:
                        last = failure
                        excluded.add(failure.worker)
                        log.warning("attempt failed", extra={"rid": rid, "attempt": attempt + 1, "worker": failure.worker,
                                                             "cause": failure.cause, "error": failure.message})
        except TimeoutError:
            if ctx.resp is not None and ctx.resp.prepared:
                with contextlib.suppress(Exception):
                    await ctx.resp.write(sse.error_event(504, "request timed out at the router", "timeout"))
                    await ctx.resp.write_eof()
                return ctx.resp
            return self.error(ctx, 504, f"no response within {cfg.request_timeout_s:g}s", "timeout", reason="timeout")
        self.metrics.retries.labels("exhausted").inc()
        assert last is not None
        if last.status is not None and last.body:
            return h1.Response(last.status, last.body, _JSON, headers=ctx.headers)
        return self.error(ctx, 502, f"all {ctx.attempts} attempts failed; last: {last.message}", "upstream_error")

    # ---- routing ---------------------------------------------------------------------------------
    def _pick(self, ctx: _Ctx, excluded: set[str]) -> tuple[WorkerState, WorkerState | None]:
        t = time.perf_counter()
        now = self.clock()
        pd = self.mode == "pd"
        pre = self._choose(ctx, self.workers.prefill_like() if not pd else self.workers.role("prefill"), excluded, now, True)
        dec = self._choose(ctx, self.workers.role("decode"), excluded, now, False) if pd else None
        if ctx.hashes:
            self.index.insert(ctx.hashes, pre.url, now)
        ctx.prefill, ctx.decode = pre.url, dec.url if dec else ""
        self.metrics.observe_decision(ctx.reason, time.perf_counter() - t)
        return pre, dec

    def _choose(self, ctx: _Ctx, pool: list[WorkerState], excluded: set[str], now: float, prefill: bool) -> WorkerState:
        # Prefer workers that have not failed this request; fall back to them rather than to nothing.
        cands = [w for w in pool if w.url not in excluded] or pool
        for _ in range(len(cands) + 1):
            views = [w.view(now) for w in cands]
            self.seq += 1
            if prefill:
                choice = choose_prefill(hashes=ctx.hashes, text_chars=len(ctx.text), workers=views, index=self.index,
                                        now=now, cfg=self.policy, rng=self.rng, seq=self.seq,
                                        replicas=ctx.named.warm_replicas() if ctx.named else None)
                ctx.predicted_chars, ctx.reason = choice.matched_chars, choice.reason
            else:
                choice = choose_decode(views, self.rng, policy="round_robin" if self.policy.policy == "round_robin" else "load",
                                       seq=self.seq)
            w = self.workers.by_url[choice.url]
            if w.breaker.acquire(now):
                return w
            cands = [c for c in cands if c is not w]
            if not cands:
                break
        raise NoWorkerAvailable(f"no available {'prefill' if prefill and self.mode == 'pd' else 'decode' if not prefill else ''} worker".replace("  ", " "))

    # ---- upstream calls --------------------------------------------------------------------------
    async def _call_read(self, w: WorkerState, path: str, payload: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        w.inflight += 1
        w.requests += 1
        try:
            resp = await self.upstreams.request(w.url, "POST", path, payload, headers)
            try:
                data = await resp.read()
            finally:
                resp.close()
        except UpstreamError as exc:
            self._failed(w, "transport", str(exc))
            raise
        finally:
            w.inflight -= 1
        self._record(w, resp.status)
        return resp.status, data, resp.headers.get("content-type", _JSON)

    async def _open(self, w: WorkerState, path: str, payload: bytes, headers: dict[str, str]) -> Response:
        w.inflight += 1
        w.requests += 1
        try:
            return await self.upstreams.request(w.url, "POST", path, payload, headers)
        except BaseException as exc:
            w.inflight -= 1
            if isinstance(exc, UpstreamError):
                self._failed(w, "transport", str(exc))
            raise

    def _record(self, w: WorkerState, status: int) -> None:
        ok = status < 500
        w.breaker.record(ok, self.clock())
        if not ok:
            w.errors += 1
            w.last_error = f"HTTP {status}"
            self.metrics.upstream_errors.labels(w.url, f"http_{status}").inc()

    def _failed(self, w: WorkerState, kind: str, message: str) -> None:
        w.errors += 1
        w.last_error = message
        w.breaker.record(False, self.clock())
        self.metrics.upstream_errors.labels(w.url, kind).inc()
        self.suspect(w)

    @staticmethod
    def _cancel(*tasks: asyncio.Task[Any] | None) -> None:
        for t in tasks:
            if t is not None and not t.done():
                t.cancel()

    def _finish_later(self, task: asyncio.Task[Any]) -> None:
        """A prefill response not needed by the client: let it complete (closing it would make the worker
        abort a request that already succeeded), bounded by the request timeout."""
        if task.done():
            if not task.cancelled():
                task.exception()
            return
        # A timer and a callback, not another task: this runs on every PD request.
        timer = asyncio.get_running_loop().call_later(self.cfg.request_timeout_s, task.cancel)

        def done(t: asyncio.Task[Any]) -> None:
            timer.cancel()
            if not t.cancelled():
                t.exception()

        task.add_done_callback(done)

    def _payload(self, ctx: _Ctx, pre: WorkerState, dec: WorkerState | None) -> bytes:
        if dec is None:
            return ctx.raw  # collocated: the client's body as it came (it parsed as a JSON object)
        body = ctx.body
        host = bootstrap_host(pre.url)
        if not (_PD_KEYS & body.keys()):
            # Splice the PD fields in before the object's closing brace instead of re-serialising the
            # whole body: `raw` parsed as a JSON object (so, without trailing whitespace, it ends in `}`)
            # and has none of these keys, so the result is the same object plus the fields.
            raw = ctx.raw.rstrip(b" \t\r\n")
            if raw.endswith(b"}"):
                port, n = pre.spec.bootstrap_port, batch_size(ctx.endpoint, body)
                fields: dict[str, Any] = (
                    {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": new_room(self.rng)} if n is None
                    else {"bootstrap_host": [host] * n, "bootstrap_port": [port] * n,
                          "bootstrap_room": [new_room(self.rng) for _ in range(n)]})
                ctx.extra["room"] = fields["bootstrap_room"]
                return raw[:-1] + (b"," if body else b"") + dumps(fields)[1:]
        full = with_bootstrap(body, ctx.endpoint, host, pre.spec.bootstrap_port, self.rng)
        ctx.extra["room"] = full["bootstrap_room"]
        return dumps(full)

    async def _prefill_first(self, pt: asyncio.Task[tuple[int, bytes, str]], other: asyncio.Task[Any],
                             pre: WorkerState) -> tuple[int, bytes, str] | None:
        """Wait until the decode side answered or the prefill failed. Returns the prefill's client error
        (to pass through) or None; raises _Retryable on a prefill failure."""
        done, _ = await asyncio.wait((pt, other), return_when=asyncio.FIRST_COMPLETED)
        if pt in done and not other.done():
            exc = pt.exception()
            if exc is not None:
                raise _Retryable("prefill_error", pre.url, str(exc))
            status, data, ctype = pt.result()
            if status in _RETRYABLE_STATUS:
                raise _Retryable("prefill_status", pre.url, f"prefill answered HTTP {status}", status, data)
            if status >= 400:
                return status, data, ctype
        return None

    async def _unary(self, ctx: _Ctx, pre: WorkerState, dec: WorkerState | None) -> h1.StreamResponse | h1.Response:
        payload = self._payload(ctx, pre, dec)
        if dec is None:  # collocated: one call, awaited in this task
            try:
                status, data, ctype = await self._call_read(pre, ctx.endpoint, payload, ctx.headers)
            except UpstreamError as exc:
                raise _Retryable("worker_error", pre.url, str(exc)) from None
            if status in _RETRYABLE_STATUS:
                raise _Retryable("worker_status", pre.url, f"HTTP {status}", status, data)
            if status == 200:
                self._feedback(ctx, pre, _safe_loads(data))
            return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
        # PD: the prefill runs as a task, the decode in this task. A prefill that fails (or answers 4xx)
        # while the decode is still waiting cancels this task's wait - the decode would otherwise wait for
        # a KV transfer that never comes. One task per request instead of two plus asyncio.wait: this is
        # the router's hottest path. The cancellation is ours only while `waiting` holds; it is undone
        # with uncancel() so that a timeout or a client disconnect arriving at the same time still wins.
        task = asyncio.current_task()
        assert task is not None
        pt = asyncio.ensure_future(self._call_read(pre, ctx.endpoint, payload, ctx.headers))
        waiting = True
        aborted = False

        def prefill_done(t: asyncio.Task[tuple[int, bytes, str]]) -> None:
            nonlocal aborted
            if not waiting or t.cancelled():
                return
            if t.exception() is not None or t.result()[0] >= 400:
                aborted = True
                task.cancel()

        pt.add_done_callback(prefill_done)
        try:
            try:
                status, data, ctype = await self._call_read(dec, ctx.endpoint, payload, ctx.headers)
            except UpstreamError as exc:
                raise _Retryable("decode_error", dec.url, str(exc)) from None
            except asyncio.CancelledError:
                if not aborted or task.uncancel() > 0:
                    raise
                return self._prefill_failed(ctx, pre, pt)
            finally:
                waiting = False
            if status in _RETRYABLE_STATUS:
                raise _Retryable("decode_status", dec.url, f"HTTP {status}", status, data)
            obj: Any = None
            if status == 200 and ctx.logprobs:
                try:
                    pstatus, pdata, _ = await pt
                except UpstreamError:  # the decode succeeded: answer without the prompt's logprobs
                    pstatus, pdata = 0, b""
                obj = loads(data)
                if pstatus == 200:
                    data = dumps(merge_input_logprobs(loads(pdata), obj))
            else:
                self._finish_later(pt)
            if status == 200:
                self._feedback(ctx, pre, obj if obj is not None else _safe_loads(data))
            return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
        except BaseException:
            self._cancel(pt)
            raise

    def _prefill_failed(self, ctx: _Ctx, pre: WorkerState, pt: asyncio.Task[tuple[int, bytes, str]]) -> h1.Response:
        """The prefill failed before the decode answered: retry (5xx, 408, 429, transport) or pass its 4xx on."""
        exc = pt.exception()
        if exc is not None:
            raise _Retryable("prefill_error", pre.url, str(exc))
        status, data, ctype = pt.result()
        if status in _RETRYABLE_STATUS:
            raise _Retryable("prefill_status", pre.url, f"prefill answered HTTP {status}", status, data)
        return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)

    async def _stream(self, request: h1.Request, ctx: _Ctx, pre: WorkerState, dec: WorkerState | None) -> h1.StreamResponse | h1.Response:
        payload = self._payload(ctx, pre, dec)
        target = dec or pre
        pt = asyncio.ensure_future(self._call_read(pre, ctx.endpoint, payload, ctx.headers)) if dec else None
        dt = asyncio.ensure_future(self._open(target, ctx.endpoint, payload, ctx.headers))
        upstream: Response | None = None
        try:
            if pt is not None:
                client_error = await self._prefill_first(pt, dt, pre)
                if client_error is not None:
                    self._cancel(dt)
                    status, data, ctype = client_error
                    return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
            try:
                upstream = await dt
            except UpstreamError as exc:
                raise _Retryable("decode_error" if dec else "worker_error", target.url, str(exc)) from None
            return await self._relay(request, ctx, pre, target, upstream, pt)
        except BaseException:
            self._cancel(pt, dt)
            if upstream is None and dt.done() and not dt.cancelled() and dt.exception() is None:
                dt.result().close()  # opened concurrently with our cancellation: release it
                target.inflight -= 1
            raise
        finally:
            if upstream is not None:
                upstream.close()
                target.inflight -= 1

    async def _relay(self, request: h1.Request, ctx: _Ctx, pre: WorkerState, target: WorkerState,
                     upstream: Response, pt: asyncio.Task[tuple[int, bytes, str]] | None) -> h1.StreamResponse | h1.Response:
        if upstream.status != 200:
            data = await upstream.read()
            self._record(target, upstream.status)
            if upstream.status in _RETRYABLE_STATUS:
                raise _Retryable("stream_status", target.url, f"HTTP {upstream.status}", upstream.status, data)
            return h1.Response(upstream.status, data, _JSON, headers=ctx.headers)
        # Commit to the client only once the first byte exists: until then a failure is retryable.
        try:
            first = await upstream._conn.next_chunk()
        except UpstreamError as exc:
            self._failed(target, "stream", str(exc))
            raise _Retryable("stream_error", target.url, str(exc)) from None
        if first is None:
            self._failed(target, "stream", "stream ended before any data")
            raise _Retryable("stream_empty", target.url, "stream ended before any data")
        prefill_meta: Any = None
        if ctx.logprobs and pt is not None:
            try:
                pstatus, pdata, _ = await pt
            except UpstreamError:
                pstatus, pdata = 0, b""
            if pstatus == 200:
                prefill_meta = sse.first_event_json(pdata)
        elif pt is not None:
            self._finish_later(pt)
        resp = ctx.resp = h1.StreamResponse(200, {
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Request-Id": ctx.rid})
        await resp.prepare(request)
        splitter = sse.EventSplitter()
        last_json: Any = None
        chunk: bytes | None = first
        t_prev = self.clock()
        self.metrics.ttft.observe(t_prev - ctx.started)
        error: str | None = None
        while chunk is not None:
            events = splitter.feed(chunk)
            if prefill_meta is not None:
                out = []
                for ev in events:
                    obj = sse.event_json(ev)
                    if obj is None:
                        out.append(ev + b"\n\n")
                    else:
                        last_json = merge_input_logprobs(prefill_meta, obj)
                        out.append(sse.data_event(last_json))
                chunk = b"".join(out)
            else:
                for ev in reversed(events):
                    obj = sse.event_json(ev)
                    if obj is not None:
                        last_json = obj
                        break
            if chunk:
                await resp.write(chunk)
                now = self.clock()
                self.metrics.itl.observe(now - t_prev)
                t_prev = now
            try:
                chunk = await upstream._conn.next_chunk()
            except UpstreamError as exc:
                error = str(exc)
                self._failed(target, "stream", error)
                break
        if error is not None:
            self.metrics.stream_errors.inc()
            log.warning("stream broke after first byte", extra={"rid": ctx.rid, "worker": target.url, "error": error})
            await resp.write(sse.error_event(502, f"upstream stream broke: {error}"))
        else:
            target.breaker.record(True, self.clock())
            if last_json is not None:
                self._feedback(ctx, pre, last_json)
        await resp.write_eof()
        return resp

    # ---- feedback --------------------------------------------------------------------------------
    def _feedback(self, ctx: _Ctx, pre: WorkerState, obj: Any) -> None:
        prompt_tokens, cached = token_counts(obj)
        if prompt_tokens and ctx.text:
            self.chars_per_token = 0.95 * self.chars_per_token + 0.05 * (len(ctx.text) / prompt_tokens)
        cpt = self.chars_per_token or 4.0
        predicted = int(ctx.predicted_chars / cpt)
        m = self.metrics
        m.predicted_tokens.inc(predicted)
        if prompt_tokens:
            m.prompt_tokens.inc(prompt_tokens)
        if cached is not None:
            m.actual_tokens.inc(cached)
        if ctx.named is not None:
            self.prefixes.record_response(ctx.named, pre.url, predicted_tokens=predicted, prompt_tokens=prompt_tokens or 0,
                                          cached_tokens=cached, prefix_tokens=int(len(ctx.named.text) / cpt),
                                          now=self.clock())
        if self.cfg.log_requests:
            log.info("request done", extra={"rid": ctx.rid, "endpoint": ctx.endpoint, "prefill": ctx.prefill,
                                            "decode": ctx.decode, "reason": ctx.reason, "attempts": ctx.attempts,
                                            "predicted_tokens": predicted, "cached_tokens": cached})


def _safe_loads(data: bytes) -> Any:
    try:
        return loads(data)
    except (DecodeError, ValueError):
        return None
