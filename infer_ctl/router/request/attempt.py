"""One attempt of a request on one chosen pair (PD) or worker (collocated).

PD: the same body, with bootstrap fields (a fresh room per attempt), goes to the prefill and the decode
concurrently; the client gets the decode's answer. A prefill that fails before the decode answered (a
stream: before its first chunk, `StreamOpener._first_chunk`) ends the attempt at once - the decode would
otherwise wait for a KV transfer that never comes - as a retry (transport error, retryable status) or by
passing its 4xx on. With `return_logprob` the prefill's
prompt logprobs are merged into the decode's answer; otherwise the prefill's answer is left to finish
in the background (closing it would make the worker abort a request that already succeeded).

Failures before the client got a byte raise retry.AttemptFailed. The prefill call and the decode call
are the two upstream calls of an attempt (both through calls.WorkerCalls): where per-attempt, prefill
and decode tracing spans begin and end.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.routing.pd import (
    batch_size,
    bootstrap_host,
    merge_input_logprobs,
    new_room,
    with_bootstrap,
)
from infer_ctl.core.routing.retry import retryable_status
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http import h1, sse
from infer_ctl.router.http.jsonio import JSON_TYPE, dumps, loads, loads_or_none
from infer_ctl.router.http.upstream import Response, UpstreamError
from infer_ctl.router.request.calls import WorkerCalls
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.feedback import Feedback
from infer_ctl.router.request.relay import (
    StreamRelay,
    aborted_before_output,
    first_chunk,
    refused_before_output,
    send_head,
)
from infer_ctl.router.request.retry import AttemptFailed, check_status

_PD_KEYS = frozenset({"bootstrap_host", "bootstrap_port", "bootstrap_room"})

Answer = tuple[int, bytes, str]
Reply = h1.StreamResponse | h1.Response


@dataclass(slots=True)
class OpenStream:
    """A worker stream whose first chunk arrived: what the relay copies on (`open_stream`)."""

    pre: WorkerState
    target: WorkerState
    upstream: Response
    first: bytes
    #: the PD prefill's answer, still arriving (None: collocated)
    prefill: asyncio.Task[Answer] | None
    release: Callable[[], None]


def prefill_outcome(pt: asyncio.Task[Answer], pre: WorkerState) -> Answer:
    """A prefill that finished before its decode: raises AttemptFailed when it failed retryably, else
    returns its answer (a 4xx to pass on, or a success)."""
    exc = pt.exception()
    if exc is not None:
        raise AttemptFailed("prefill_error", pre.url, str(exc))
    status, data, ctype = pt.result()
    check_status("prefill_status", pre, status, data, "prefill answered ")
    return status, data, ctype


def landed(ctx: RequestContext) -> None:
    """The attempt's first byte or answer: its prompt is in the prefill's radix tree (SGLang inserts it
    at the end of the prefill forward, before the first token goes out), so requests held for it
    (router/request/coalesce.py) may go, and a long prompt is predicted there (picker.py `_long`)."""
    if ctx.flight is not None:
        ctx.flight.land()
    if ctx.on_landed is not None:
        predict, ctx.on_landed = ctx.on_landed, None
        predict()


def cancel(*tasks: asyncio.Task[Any] | None) -> None:
    for t in tasks:
        if t is not None and not t.done():
            t.cancel()


class StreamOpener:
    """Opening a pair's stream up to its first chunk, and the prefill answers left to finish: what both
    an attempt and mid-stream recovery (recovery.py, which the relay holds) need, so it is built before
    either."""

    def __init__(self, calls: WorkerCalls, *, request_timeout_s: float, early_head: bool = True) -> None:
        self.calls = calls
        self.request_timeout_s = request_timeout_s
        #: the client's head goes out when the worker's does (router.stream_head early, relay.py `send_head`)
        self.early_head = early_head
        #: prefill answers left to finish after the client got the decode's (`finish_later`): a drain
        #: waits for them too, or their accounting and tracing spans would be cut off at shutdown
        self.lingering: set[asyncio.Task[Any]] = set()

    def finish_later(self, task: asyncio.Task[Any]) -> None:
        """A prefill answer the client does not need: let it complete (closing it would make the worker
        abort a request that already succeeded), bounded by the request timeout."""
        if task.done():
            if not task.cancelled():
                task.exception()
            return
        # A timer and a callback, not another task: this runs on every PD request.
        timer = asyncio.get_running_loop().call_later(self.request_timeout_s, task.cancel)
        self.lingering.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            timer.cancel()
            self.lingering.discard(t)
            if not t.cancelled():
                t.exception()

        task.add_done_callback(done)

    async def open_stream(self, ctx: RequestContext, pre: WorkerState, dec: WorkerState | None,
                          payload: bytes) -> OpenStream | h1.Response:
        """Send `payload` to the pair and wait for the stream's first chunk: an OpenStream (its `release`
        must be called when the stream ends), or a worker's non-retryable answer to pass on. Raises
        AttemptFailed before the first chunk. Mid-stream recovery (recovery.py) opens its continuations here."""
        calls = self.calls
        read, open_, release = (calls.read, calls.open, calls.done) if ctx.obs is None else ctx.obs.calls(calls)
        target = dec or pre
        if dec is None:
            # collocated: the one call awaited in this task (a task of its own would cost a turn of the
            # event loop before the upstream write, on every streamed request)
            try:
                upstream = await open_(target, ctx.endpoint, payload, ctx.headers)
            except UpstreamError as exc:
                raise AttemptFailed("worker_error", target.url, str(exc)) from None
            return await self._first(ctx, pre, target, upstream, None, release)
        pt = asyncio.ensure_future(read(pre, ctx.endpoint, payload, ctx.headers))
        dt = asyncio.ensure_future(open_(target, ctx.endpoint, payload, ctx.headers))
        try:
            # until the decode's stream opened: a prefill that fails ends the attempt
            done, _ = await asyncio.wait((pt, dt), return_when=asyncio.FIRST_COMPLETED)
            if pt in done and not dt.done():
                status, data, ctype = prefill_outcome(pt, pre)
                if status >= 400:
                    cancel(dt)
                    return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
            try:
                upstream = await dt
            except UpstreamError as exc:
                raise AttemptFailed("decode_error", target.url, str(exc)) from None
        except BaseException:
            cancel(pt, dt)
            if dt.done() and not dt.cancelled() and dt.exception() is None:
                release(target, dt.result())  # opened concurrently with our cancellation: release it
            raise
        try:
            return await self._first(ctx, pre, target, upstream, pt, release)
        except BaseException:
            cancel(pt)
            raise

    async def _first(self, ctx: RequestContext, pre: WorkerState, target: WorkerState, upstream: Response,
                     pt: asyncio.Task[Answer] | None,
                     release: Callable[[WorkerState, Response], None]) -> OpenStream | h1.Response:
        """`open_stream` once the worker's head arrived: its non-200 answer, or the stream's first chunk."""
        if upstream.status != 200:
            try:
                data = await upstream.read()
            finally:
                release(target, upstream)
            self.calls.record(target, upstream.status)
            check_status("stream_status", target, upstream.status, data)
            return h1.Response(upstream.status, data, JSON_TYPE, headers=ctx.headers)
        try:
            if self.early_head:
                await send_head(ctx)  # the client reads it while the worker computes (relay.py `send_head`)
            first = await self._first_chunk(pre, target, upstream, pt)
            if isinstance(first, tuple):  # the prefill's own 4xx, before the decode's first chunk: passed on
                release(target, upstream)
                status, data, ctype = first
                return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
            aborted = aborted_before_output(first)
            if aborted is not None and retryable_status(aborted):
                # the prefill's call failing too says which side broke (a killed prefill); else the decode
                broke = pre if pt is not None and pt.done() and not pt.cancelled() and pt.exception() else target
                why = f"aborted before its first token (status {aborted})"
                self.calls.failed(broke, "stream", why)
                raise AttemptFailed("stream_abort", broke.url, why)
        except BaseException:
            release(target, upstream)
            raise
        return OpenStream(pre, target, upstream, first, pt, lambda: release(target, upstream))

    async def _first_chunk(self, pre: WorkerState, target: WorkerState, upstream: Response,
                           pt: asyncio.Task[Answer] | None) -> bytes | Answer:
        """The stream's first chunk, or - PD - the end of the attempt when its prefill fails first: its
        decode would wait for a KV transfer that never comes (SGLang sends a stream's head at once, so a
        decode that answered says nothing yet of its prefill). As in `AttemptRunner.unary`: the prefill's
        failure cancels this task's wait, undone with uncancel() so that a timeout or a client disconnect
        arriving at the same time still wins. Raises AttemptFailed (retryable), or returns the prefill's 4xx."""
        if pt is None:  # collocated
            return await first_chunk(self.calls, target, upstream)
        if pt.done():  # with the decode's head (`open_stream` looks at a prefill done before it only)
            return prefill_outcome(pt, pre) if _failed(pt) else await first_chunk(self.calls, target, upstream)
        task = asyncio.current_task()
        assert task is not None
        waiting = True
        failed = False

        def prefill_done(t: asyncio.Task[Answer]) -> None:
            nonlocal failed
            if waiting and _failed(t):
                failed = True
                task.cancel()

        pt.add_done_callback(prefill_done)
        try:
            return await first_chunk(self.calls, target, upstream)
        except asyncio.CancelledError:
            if not failed or task.uncancel() > 0:
                raise
        finally:
            waiting = False
        return prefill_outcome(pt, pre)  # raises AttemptFailed when it failed retryably


def _failed(pt: asyncio.Task[Answer]) -> bool:
    """A done prefill call that failed: a transport error or an HTTP error status."""
    return not pt.cancelled() and (pt.exception() is not None or pt.result()[0] >= 400)


class AttemptRunner:
    def __init__(self, calls: WorkerCalls, relay: StreamRelay, feedback: Feedback, opener: StreamOpener, *,
                 rng: random.Random) -> None:
        self.calls = calls
        self.relay = relay
        self.feedback = feedback
        self.opener = opener
        self.rng = rng
        self.finish_later = opener.finish_later
        self.open_stream = opener.open_stream

    @property
    def lingering(self) -> set[asyncio.Task[Any]]:
        """Prefill answers still arriving after the client's (StreamOpener.lingering)."""
        return self.opener.lingering

    def payload(self, ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> bytes:
        """The body both workers get: the client's, plus the PD bootstrap fields with a new room."""
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
                if ctx.obs is not None:
                    ctx.obs.room(fields["bootstrap_room"])
                return raw[:-1] + (b"," if body else b"") + dumps(fields)[1:]
        out = with_bootstrap(body, ctx.endpoint, host, pre.spec.bootstrap_port, self.rng)
        if ctx.obs is not None:
            ctx.obs.room(out["bootstrap_room"])
        return dumps(out)

    # ---- non-streaming ---------------------------------------------------------------------------
    async def unary(self, ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> Reply:
        calls = self.calls
        # with tracing or tenants, the calls go through the request's observer (a span, the share clock)
        read = calls.read if ctx.obs is None else ctx.obs.calls(calls)[0]
        payload = self.payload(ctx, pre, dec)
        if dec is None:  # collocated: one call, awaited in this task
            try:
                status, data, ctype = await read(pre, ctx.endpoint, payload, ctx.headers)
            except UpstreamError as exc:
                raise AttemptFailed("worker_error", pre.url, str(exc)) from None
            check_status("worker_status", pre, status, data)
            if status == 200:
                landed(ctx)
                self.feedback.answered(ctx, pre, loads_or_none(data))
            return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
        # PD: the prefill runs as a task, the decode in this task. A prefill that fails (or answers 4xx)
        # while the decode is still waiting cancels this task's wait - the decode would otherwise wait for
        # a KV transfer that never comes. One task per request instead of two plus asyncio.wait: this is
        # the router's hottest path. The cancellation is ours only while `waiting` holds; it is undone
        # with uncancel() so that a timeout or a client disconnect arriving at the same time still wins.
        task = asyncio.current_task()
        assert task is not None
        pt = asyncio.ensure_future(read(pre, ctx.endpoint, payload, ctx.headers))
        waiting = True
        aborted = False

        def prefill_done(t: asyncio.Task[Answer]) -> None:
            nonlocal aborted
            if t.cancelled():
                return
            if t.exception() is None and t.result()[0] == 200:
                landed(ctx)  # the prefill is done: its prompt is in its radix tree
            if not waiting:
                return
            if t.exception() is not None or t.result()[0] >= 400:
                aborted = True
                task.cancel()

        pt.add_done_callback(prefill_done)
        try:
            try:
                status, data, ctype = await read(dec, ctx.endpoint, payload, ctx.headers)
            except UpstreamError as exc:
                raise AttemptFailed("decode_error", dec.url, str(exc)) from None
            except asyncio.CancelledError:
                if not aborted or task.uncancel() > 0:
                    raise
                status, data, ctype = prefill_outcome(pt, pre)  # the prefill's 4xx, passed on
                return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
            finally:
                waiting = False
            check_status("decode_status", dec, status, data)
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
                self.finish_later(pt)
            if status == 200:
                landed(ctx)
                self.feedback.answered(ctx, pre, obj if obj is not None else loads_or_none(data))
            return h1.Response(status, data, ctype.split(";")[0], headers=ctx.headers)
        except BaseException:
            cancel(pt)
            raise

    # ---- streaming -------------------------------------------------------------------------------
    async def stream(self, ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> Reply:
        opened = await self.open_stream(ctx, pre, dec, self.payload(ctx, pre, dec))
        if not isinstance(opened, OpenStream):
            return opened
        if ctx.on_landed is not None and refused_before_output(opened.first):
            ctx.on_landed = None  # the worker refused the long prompt: nothing to predict (picker.py `_long`)
        try:
            if opened.prefill is not None and ctx.logprobs:
                landed(ctx)  # before the wait for the prefill's answer (`_prefill_meta`)
            # else once the first chunk went to the client: the landing (its residency walk over the whole
            # prompt, docs/benchmarks.md) is not on the client's time to first byte
            return await self.relay.run(ctx, pre, opened.target, opened.upstream, opened.first,
                                        await self._prefill_meta(ctx, opened.prefill), on_first=lambda: landed(ctx))
        except BaseException:
            cancel(opened.prefill)
            raise
        finally:
            landed(ctx)  # the first chunk arrived, whatever happened after it (a no-op once landed)
            opened.release()

    async def _prefill_meta(self, ctx: RequestContext, pt: asyncio.Task[Answer] | None) -> Any:
        """The prefill's first event when the client wants the prompt's logprobs (merged into every
        streamed event); otherwise the prefill is left to finish on its own."""
        if pt is None:
            return None
        if not ctx.logprobs:
            self.finish_later(pt)
            return None
        try:
            pstatus, pdata, _ = await pt
        except UpstreamError:
            return None
        return sse.first_event_json(pdata) if pstatus == 200 else None
