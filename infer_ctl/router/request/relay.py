"""The streaming relay: a worker's SSE stream copied to the client chunk by chunk.

The client's head (200, text/event-stream) goes out as soon as a worker's stream head arrived
(`send_head`, router.stream_head early; with first_chunk it goes with the first chunk). Until the
stream's first chunk exists (`first_chunk`) a failure is an AttemptFailed and the request is retried,
within the head already sent; an error the router answers after that head (router/request/proxy.py
`committed`) ends the stream as an error event. From the first byte on nothing is retried; a stream that breaks ends with an error event (`data: {"error": ...}` then `data: [DONE]`),
never silently - unless mid-stream recovery (recovery.py) continues it from another pair, in which
case the client sees one unbroken stream. Back-pressure is end to end: `resp.write` waits while the client's socket is full, and
the upstream client pauses reading from the worker while its chunks are not taken. With the prompt's
logprobs from the prefill (`prefill_meta`), each event is rewritten with them merged in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from infer_ctl.core.routing.pd import merge_input_logprobs
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http import h1, sse
from infer_ctl.router.http.upstream import Response, UpstreamError
from infer_ctl.router.request.calls import WorkerCalls
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.feedback import Feedback
from infer_ctl.router.request.recovery import StreamRecovery
from infer_ctl.router.request.retry import AttemptFailed
from infer_ctl.router.request.stream import StreamTrack

log = logging.getLogger("infer_ctl.router")


def _stream_headers(ctx: RequestContext) -> dict[str, str]:
    return {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Request-Id": ctx.rid}


async def send_head(ctx: RequestContext) -> None:
    """Commit the client's stream now: its head, before the worker's first chunk (router.stream_head
    early). The client then parses it while the worker computes the prefill instead of after the first
    token (`bench_router_stream_latency.py`: 0.5-0.8 ms of a Python client's time to first token on this
    machine). Once per request: a retry or a recovery's continuation streams into the same head."""
    if ctx.resp is None or not ctx.resp.prepared:
        ctx.resp = h1.StreamResponse(200, _stream_headers(ctx))
        await ctx.resp.prepare(ctx.request)


async def first_chunk(calls: WorkerCalls, target: WorkerState, upstream: Response) -> bytes:
    """The stream's first chunk; a stream that breaks or ends before it is a retryable failure."""
    try:
        first = await upstream.next_chunk()
    except UpstreamError as exc:
        calls.failed(target, "stream", str(exc))
        raise AttemptFailed("stream_error", target.url, str(exc)) from None
    if first is None:
        calls.failed(target, "stream", "stream ended before any data")
        raise AttemptFailed("stream_empty", target.url, "stream ended before any data")
    return first


def aborted_before_output(first: bytes) -> int | None:
    """The status of a stream whose first event is a scheduler abort that generated nothing, else None.
    SGLang's decode answers a request whose prefill died before the KV transfer (or any request its
    scheduler aborts before a token) with a 200 stream whose one event carries `finish_reason`
    {"type": "abort", "status_code": 500}: a failed attempt that reached the client as an empty "success"
    (seen with a prefill killed under stream load). A bytes test first: a normal chunk is not parsed."""
    if b'"abort"' not in first:
        return None
    obj = sse.first_event_json(first)
    if not isinstance(obj, dict) or not isinstance(meta := obj.get("meta_info"), dict):
        return None
    fr = meta.get("finish_reason")
    if not (isinstance(fr, dict) and fr.get("type") == "abort") or obj.get("output_ids") or meta.get("completion_tokens"):
        return None
    status = fr.get("status_code")
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def refused_before_output(first: bytes) -> bool:
    """Whether a stream's first event says the worker did not take the prompt: SGLang streams a request
    it rejects (over its context length, bad sampling parameters) as a 200 whose first event is
    `{"error": {...}}`, or a scheduler abort before any token (`aborted_before_output`). A bytes test
    first: a normal chunk is not parsed."""
    if b'"error"' in first:
        obj = sse.first_event_json(first)
        if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
            return True
    return aborted_before_output(first) is not None


class StreamRelay:
    def __init__(self, calls: WorkerCalls, feedback: Feedback, *, clock: Callable[[], float],
                 metrics: RouterMetrics, recovery: StreamRecovery | None = None) -> None:
        self.calls = calls
        self.feedback = feedback
        self.clock = clock
        self.metrics = metrics
        #: mid-stream recovery (recovery.py); None: a broken stream ends with an error event
        self.recovery = recovery

    async def run(self, ctx: RequestContext, pre: WorkerState, target: WorkerState, upstream: Response, first: bytes,
                  prefill_meta: Any, on_first: Callable[[], None] | None = None) -> h1.StreamResponse:
        """Commit to the client and copy the rest of the stream; `pre` is credited with the answer.
        `on_first` is called once the first piece was handed to the client's socket (or failed to be)."""
        resp = ctx.resp
        if resp is None or not resp.prepared:  # the head goes with the first chunk (router.stream_head)
            resp = ctx.resp = h1.StreamResponse(200, _stream_headers(ctx))
        first_piece = True
        splitter = sse.EventSplitter()
        last_json: Any = None
        #: a /generate batch's stream (chunks carry SGLang's top-level `index`): each prompt's last chunk,
        #: whose meta_info is that prompt's usage; the last event alone is one prompt's (the tenants'
        #: tokens_per_min charged one prompt of a streamed batch and gave the others' reservation back)
        items: dict[int, Any] | None = None
        chunk: bytes | None = first
        t_prev = t_first = self.clock()
        error: str | None = None
        booked = False
        #: mid-stream recovery (recovery.py): what the client was sent, when this stream could be continued
        track = self.recovery.watch(ctx) if self.recovery is not None else None
        #: continuations opened by recovery: released when the stream ends (the first is the attempt's)
        opened: list[Any] = []

        def succeeded() -> None:
            nonlocal booked
            booked = True
            target.breaker.record(True, self.clock())
            if items:
                self.feedback.answered(ctx, pre, [items[i] for i in sorted(items)])  # as a whole batch answers
            elif last_json is not None:
                self.feedback.answered(ctx, pre, last_json)
            if ctx.obs is not None:
                ctx.obs.streamed(t_first - ctx.started, t_first, t_prev)

        try:
            while chunk is not None:
                events = splitter.feed(chunk)
                tracked = track is not None and track.active
                # the bytes to send depend on the events' JSON only when they are rewritten (the prompt's
                # logprobs merged in, a continuation after a recovery): otherwise they go out first and
                # the events are read after the write, off the client's time to first byte (and each token's)
                rewrite = prefill_meta is not None or (tracked and track is not None and track.rewriting)
                if rewrite:
                    chunk, last_json, items = self._read(events, chunk, splitter, track if tracked else None,
                                                         prefill_meta, last_json, items)
                elif tracked and (splitter.pending or b"\r" in chunk):
                    chunk = b"".join([ev + b"\n\n" for ev in events])  # whole events only (`_tracked`)
                # socket writes are much of the router's CPU per streamed request: the head goes with the first
                # piece, and the end of the stream with the last one when the worker's stream is complete
                last = upstream.complete
                try:
                    if first_piece:
                        first_piece = False
                        try:
                            if resp.prepared:  # its head went out when the worker's came (`send_head`)
                                await resp.write(chunk, last)
                            else:
                                await resp.prepare(ctx.request, chunk)
                        finally:
                            self.metrics.ttft.observe(t_first - ctx.started)
                            if ctx.obs is not None:
                                ctx.obs.first_chunk(t_first - ctx.started)
                            if on_first is not None:
                                on_first()
                        if last:
                            await resp.write(b"", last=True)
                    elif chunk or last:
                        await resp.write(chunk, last)
                finally:
                    if not rewrite:
                        last_json, items = self._read(events, chunk, splitter, track if tracked else None, None,
                                                      last_json, items)[1:]
                    if ctx.obs is not None:  # tenants: what was streamed, for a stream cancelled before its usage
                        ctx.obs.stream_chunk(events, last_json, items)
                if not resp.delivered and events and b"[DONE]" in events[-1] and sse.is_done(events[-1]):
                    # the client has the whole content: a close from here on is a success (h1.StreamResponse.
                    # delivered), so the success is booked now, not after the worker's terminator arrives
                    resp.delivered = True
                    succeeded()
                if chunk:
                    now = self.clock()
                    self.metrics.itl.observe(now - t_prev)
                    t_prev = now
                try:
                    chunk = await upstream.next_chunk()
                except UpstreamError as exc:
                    if resp.delivered:  # lost after [DONE]: the client has everything it asked for
                        break
                    error = str(exc)
                    self.calls.failed(target, "stream", error)
                    if track is None or self.recovery is None:
                        break
                    more = await self.recovery.resume(ctx, track, target, error)
                    if more is None:
                        break
                    opened.append(more)  # the rest of the stream comes from a new pair
                    pre, target, upstream, chunk = more.pre, more.target, more.upstream, more.first
                    splitter = sse.EventSplitter()
                    error = None
        except BaseException:
            for o in opened:
                if o.prefill is not None and not o.prefill.done():
                    o.prefill.cancel()
            raise
        finally:
            for o in opened:
                o.release()
            if track is not None and self.recovery is not None:
                self.recovery.learn(track)
        if error is not None:
            self.metrics.stream_errors.inc()
            log.warning("stream broke after first byte",
                        extra={"rid": ctx.rid, "worker": target.url, "status": 502, "error": error})
            resp.outcome = 502  # the request failed: its count, log line and span say so, not the head's 200
            await resp.write(sse.error_event(502, f"upstream stream broke: {error}"))
        elif not booked:
            succeeded()
        await resp.write_eof()
        return resp

    @staticmethod
    def _read(events: list[bytes], chunk: bytes, splitter: sse.EventSplitter, track: StreamTrack | None,
              prefill_meta: Any, last_json: Any, items: dict[int, Any] | None) -> tuple[bytes, Any, dict[int, Any] | None]:
        """One chunk's events read: the chunk as the client gets it (rewritten with the prompt's logprobs,
        or a recovery's continuation in the client's terms), the stream's last JSON event and its batch items."""
        if track is not None:
            chunk, last_json = _tracked(track, events, chunk, splitter, last_json)
        elif prefill_meta is not None:
            out = []
            for ev in events:
                obj = sse.event_json(ev)
                if obj is None:
                    out.append(ev + b"\n\n")
                else:
                    last_json = merge_input_logprobs(prefill_meta, obj)
                    out.append(sse.data_event(last_json))
                    items = _item(items, last_json)
            chunk = b"".join(out)
        else:
            for ev in reversed(events):
                obj = sse.event_json(ev)
                if obj is not None:
                    last_json = obj
                    break
            if items is not None or (isinstance(last_json, dict) and "index" in last_json):
                for ev in events:  # a batch: every event, so no prompt's last chunk is missed
                    items = _item(items, sse.event_json(ev))
        return chunk, last_json, items


def _tracked(track: StreamTrack, events: list[bytes], chunk: bytes, splitter: sse.EventSplitter,
             last_json: Any) -> tuple[bytes, Any]:
    """A recoverable stream's chunk: every event is read into `track`, and only whole events are sent
    (a cut inside an event would leave the client half of it before the continuation). Rewritten only
    after a recovery; otherwise the worker's bytes go out as they came."""
    rewrite = track.rewriting
    out: list[bytes] | None = [] if rewrite or splitter.pending or b"\r" in chunk else None
    for ev in events:
        obj = sse.event_json(ev)
        if obj is not None:
            if rewrite:
                obj = track.rewrite(obj)
            track.seen(obj)
            last_json = obj
        if out is not None:
            out.append(sse.data_event(obj) if rewrite and obj is not None else ev + b"\n\n")
    return (chunk if out is None else b"".join(out)), last_json


def _item(items: dict[int, Any] | None, obj: Any) -> dict[int, Any] | None:
    """Keep `obj` as its batch item's latest chunk (SGLang's /generate batch streams: `index`)."""
    if isinstance(obj, dict):
        i = obj.get("index")
        if isinstance(i, int) and not isinstance(i, bool) and isinstance(obj.get("meta_info"), dict):
            items = {} if items is None else items
            items[i] = obj
    return items
