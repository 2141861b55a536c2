"""In-flight prefix coalescing on the request path (docs/router.md "In-flight prefix coalescing").

Wraps each attempt (router/request/retry.py runs it right after `pick`): the attempt's prompt becomes pending
on its chosen prefill (core/routing/coalesce.py `PendingBlocks`, read by the picker's exact path), and
when a live flight on that same worker is computing at least `min_tokens` of the prompt's shared part,
the attempt waits for it before it is sent: until the leader's blocks land (its first streamed byte or
its answer - SGLang inserts a prompt into the radix tree at the end of its prefill forward, before it
streams the first token - or, with KV events, the worker's stores covering the leader's prompt), the
leader fails, or `max_wait_s` after the request was first held (all its holds together). A leader that
fails hands over: when its worker failed it (a retryable failure, or the worker went away) its
followers are tried elsewhere (a retry each, while they have one); otherwise (its client went away, a
4xx) the first of its followers that can still go is promoted - it is sent, and becomes the flight the
others wait for. A waiting request keeps its admission slot, counts as in flight on the worker, and is
cancelled like any request (client gone, request timeout). With several router processes every
process publishes its flights on the flight board (router/fleet/shared_flights.py) and mirrors the others'
into its overlay: a request waits for a flight of another process as for one of its own, released when
that process publishes its landing (looked at every `POLL_S` while someone waits) or failure (tried
elsewhere when the worker failed it, else one follower here takes over).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from infer_ctl.core.routing.coalesce import (
    LANDED,
    CoalesceConfig,
    Flight,
    PendingBlocks,
    hold_blocks,
    should_hold,
)
from infer_ctl.core.tenancy.estimate import request_estimate
from infer_ctl.router.fleet.shared_flights import FAILED, FAILED_WORKER, POLL_S, FlightBoard, Remote
from infer_ctl.router.fleet.shared_flights import LANDED as BOARD_LANDED
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.retry import AttemptFailed

log = logging.getLogger("infer_ctl.router")

R = TypeVar("R")
Attempt = Callable[[RequestContext, WorkerState, WorkerState | None], Awaitable[R]]

_WAIT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: the routing text of a prompt that is pending (the overlay is unbounded otherwise: a 30 MB body,
#: under max_body_bytes, put 470,000 blocks, 43 MB and 1 s of the event loop into it). 512 KiB is
#: about 131,000 tokens at 4 characters a token, a long context's whole prompt; a prompt's first
#: blocks are a chain from the root, so the cut keeps each worker's entries prefix-closed
MAX_PENDING_CHARS = 512 * 1024
#: a leader whose prompt's landing the router only learns from its whole answer (not streamed, on a
#: worker without a trusted KV-event stream) is waited for only when that answer follows its prefill
#: closely: at most this many new tokens. A longer answer would hold the followers through the
#: leader's decode (up to max_wait_s) for a prefix that landed long before
LATE_LANDING_TOKENS = 16
#: published unary flights per KV batch whose landing `kv_batch` looks for (a residency lookup each,
#: several microseconds): a process's unary requests in flight on one worker can be many, and each
#: batch would look at every one; the oldest are the next to finish their prefill
KV_LANDING_CHECKS = 16
#: why a flight failed (Flight.cause), besides the AttemptFailed of a failure the worker caused
CLIENT, ANSWER, ERROR = "client", "answer", "error"


def worker_gone(w: WorkerState) -> bool:
    return w.removed or not w.healthy or w.draining


class _Hold:
    """One held request: what it waits for now (`leader`, `fut`), and once that ended for it, how
    (`verdict`: landed, promoted, rerouted, leader_failed, timeout). Set by the coalescer as leaders
    end; read by the held request's own task when it wakes."""

    __slots__ = ("ctx", "exclude", "flight", "fut", "leader", "pre", "task", "verdict")

    def __init__(self, ctx: RequestContext, pre: WorkerState, flight: Flight) -> None:
        self.ctx, self.pre, self.flight = ctx, pre, flight
        self.task = asyncio.current_task()
        self.leader: Flight | None = None
        self.fut: asyncio.Future[str] | None = None
        self.verdict: str | None = None
        #: rerouted: the worker the failed leader's failure named (the retry avoids it)
        self.exclude = pre.url

    def can_go(self, now: float) -> bool:
        """Still wanted: its client is there (no cancellation pending) and its time is not up."""
        t = self.task
        return (t is None or (not t.done() and not t.cancelling())) and \
            (self.ctx.hold_until is None or now < self.ctx.hold_until)


class Coalescer:
    def __init__(self, cfg: CoalesceConfig, *, block_chars: int, chars_per_token: Callable[[], float],
                 registry: CollectorRegistry | None = None, max_retries: int = 0, kv: KvRouting | None = None,
                 board: FlightBoard | None = None) -> None:
        self.cfg = cfg
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.pending = PendingBlocks()
        self.max_blocks = max(1, MAX_PENDING_CHARS // block_chars)
        #: the exact index (router/kvindex/kv_routing.py), for landing a leader on its worker's KV events;
        #: None: coalescing is off (the router keeps a coalescer that nothing calls)
        self.kv = kv
        #: the router's retries per request: a follower whose leader's worker failed is re-routed
        #: only while it has one left (else it goes to the worker itself, as without a hold)
        self.max_retries = max_retries
        #: leaders someone waits for, per worker, with their request (the KV-events landing check)
        self._waited: dict[str, dict[Flight, Any]] = {}
        #: published unary flights on exact workers, per worker, whose landing their worker's KV events
        #: may say before their answer: landed by `kv_batch` whether or not anyone here waits (another
        #: process's requests may, and only this process publishes the landing)
        self._kv_landing: dict[str, dict[Flight, RequestContext]] = {}
        self._futures: dict[Flight, asyncio.Future[str]] = {}
        #: each waited-for leader's held requests, first held first (an ordered set)
        self._queue: dict[Flight, dict[_Hold, None]] = {}
        #: followers promoted to compute a failed leader's prefix, and re-routed ones (since start)
        self.promoted = 0
        self.rerouted = 0
        #: flights that landed and are still pending, per worker (until the worker's events cover them),
        #: each with its worker's `kv.marks` when it landed or was last looked at
        self._landed: dict[str, dict[Flight, tuple[int, int]]] = {}
        #: several router processes sharing their flights: the flight board (router/fleet/shared_flights.py),
        #: and the task that looks at it while a request here waits for another process's flight
        self.board = board
        self._poll: asyncio.Task[None] | None = None
        self.holding = 0
        self.held = Counter("inferctl_router_coalesce_held_total",
                            "Requests held for an in-flight request computing their prefix, by how the hold "
                            "ended (landed, promoted: the leader failed and this one computes in its place, "
                            "rerouted: the leader's worker failed it, leader_failed, timeout, cancelled)",
                            ["reason"], registry=registry)
        self.wait = Histogram("inferctl_router_coalesce_wait_seconds",
                              "Time a request waited for an in-flight request computing its prefix (one "
                              "hold, through any leaders that took over)",
                              buckets=_WAIT, registry=registry)

    def wrap(self, attempt: Attempt[R]) -> Attempt[R]:
        async def run(ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> R:
            return await self.run(ctx, pre, dec, attempt)
        return run

    def held_blocks(self, ctx: RequestContext) -> int:
        """Blocks of the prompt the chosen prefill held at the decision, in the index's blocks."""
        if ctx.exact and ctx.held_tokens is not None:
            return int(ctx.held_tokens * self.chars_per_token()) // self.block_chars
        return ctx.predicted_chars // self.block_chars

    async def run(self, ctx: RequestContext, pre: WorkerState, dec: WorkerState | None, attempt: Attempt[R]) -> R:
        if not ctx.hashes:
            return await attempt(ctx, pre, dec)
        hashes = ctx.hashes[: self.max_blocks]
        board = self.board
        if board is not None:  # the picker syncs only on its exact path: the hold decides on the board as it is
            self.sync((pre.url,), hashes)
        leader, computing = self.pending.leader(pre.url, hashes)
        flight = Flight(pre.url, hashes, ctx)
        flight.on_done = lambda state: self._flight_done(flight, state)
        held = self.held_blocks(ctx)
        own = self.pending.add(flight, held)
        if board is not None:
            landing = self._landing(ctx, pre.url)
            if landing == "kv":
                self._kv_landing.setdefault(pre.url, {})[flight] = ctx
            # published as held up to the first block it computes itself: a follower held here for a
            # leader is never taken for the flight computing the leader's blocks in a third process
            board.publish(flight, max(held, own), late=landing == "late")
        ctx.flight = flight
        try:
            if should_hold(leader, computing, self.block_chars, self.chars_per_token(), self.cfg) and \
                    (ctx.hold_until is None or asyncio.get_running_loop().time() < ctx.hold_until) and \
                    self._lands_in_time(leader, pre.url):
                assert leader is not None
                hold = await self._hold(ctx, pre, flight, leader)
                for w in (pre, dec):
                    if w is not None and worker_gone(w):
                        # it went away while the request was held (its connections were closed then,
                        # the leader's too): a new attempt on another worker, not a late send to it
                        raise AttemptFailed("worker_gone_while_held", w.url, "the worker went away while "
                                            "the request was held for a request computing its prefix")
                if hold.verdict == "rerouted":
                    raise AttemptFailed("coalesce_rerouted", hold.exclude, "the request computing its prefix "
                                        "failed on the worker while this one was held for it")
            result = await attempt(ctx, pre, dec)
        except AttemptFailed as exc:
            self._end(flight, exc)  # the worker's failure: its followers are tried elsewhere
            raise
        except asyncio.CancelledError:
            self._end(flight, CLIENT)  # client gone, request timeout: one follower takes over
            raise
        except BaseException:
            self._end(flight, ERROR)
            raise
        self._end(flight, ANSWER)  # an answer without landing (a 4xx): one follower takes over
        return result

    def _lands_in_time(self, leader: Flight | None, worker: str) -> bool:
        """Whether the router will hear soon after the leader's prefill that its blocks landed: its
        first streamed byte, its worker's KV events, or a whole answer of a few tokens (another
        process's flight: as that process published it)."""
        lctx = leader.tag if leader is not None else None
        if isinstance(lctx, Remote):
            return not lctx.late
        if not isinstance(lctx, RequestContext):
            return True
        return self._landing(lctx, worker) != "late"

    def _landing(self, ctx: RequestContext, worker: str) -> str:
        """How the router hears that a flight's prompt landed on `worker`: its first byte ("soon"),
        its worker's KV events ("kv": a unary request on a worker whose stream is exact), its whole
        answer of a few tokens ("soon"), or only its whole answer, long after its prefill ("late")."""
        if ctx.stream:
            return "soon"
        kv = self.kv
        state = kv.workers.get(worker) if kv is not None and kv.view is not None else None
        if state is not None and state.exact:
            return "kv"
        completion = request_estimate(ctx.endpoint, ctx.body, self.chars_per_token())[1]
        return "soon" if 0 < completion <= LATE_LANDING_TOKENS else "late"

    def _end(self, flight: Flight, cause: object) -> None:
        """The attempt ended: a flight that never landed fails (`cause`: its waiters are re-routed, or
        one of them takes over, `_promote`) and leaves the overlay now (`_flight_done`); a landed one
        left it, or leaves it, as its worker's KV events say (`kv_batch`)."""
        flight.fail(cause)

    def _flight_done(self, flight: Flight, state: str) -> None:
        """A flight's one transition out of computing: its waiters hear it (`_leader_done`). Failed: it
        leaves the overlay now (after its blocks were handed over). Landed (its first byte or answer,
        or its worker's KV events): it stays pending until its worker's KV events cover it (`kv_batch`)
        or, at the latest, for the grace (a worker without KV events), not until its request ends. An
        overlay kept after the exact index has the prompt's stores would count as held a prompt the
        worker reports gone afterwards: measured in the stale benchmark (random direct traffic), where a
        session's next turn, sent as its previous turn ended, went to the worker that had just evicted
        it (0 cached) instead of one that held its system prompt."""
        self._leader_done(flight, state)
        kl = self._kv_landing.get(flight.worker)
        if kl is not None and kl.pop(flight, None) is not None and not kl:
            del self._kv_landing[flight.worker]
        if self.board is not None:
            self.board.state(flight, BOARD_LANDED if state == LANDED else
                             FAILED_WORKER if isinstance(flight.cause, AttemptFailed) else FAILED)
        if not flight.added:
            return
        if state != LANDED or self.cfg.grace_s <= 0 or self._stored(flight) == "hbm":
            self._drop(flight)
            return
        kv = self.kv
        marks = kv.marks(flight.worker) if kv is not None else (0, 0)
        self._landed.setdefault(flight.worker, {})[flight] = marks
        asyncio.get_running_loop().call_later(self.cfg.grace_s, self._unpend, flight)

    def _stored(self, flight: Flight) -> str | None:
        """Where the exact index holds the flight's whole prompt (hbm: its stores came; not 90 % of it,
        as for a leader's landing: a prompt whose shared part the worker held before would leave before
        its own tail was stored), None when it cannot tell (`kv.residency`)."""
        kv, ctx = self.kv, flight.tag
        if kv is None or not isinstance(ctx, RequestContext):
            return None
        return kv.residency(ctx.hashes, ctx.text, flight.worker, kv.kind(ctx.endpoint, ctx.body), ctx.body,
                            share=1.0)

    def _drop(self, flight: Flight) -> None:
        """One of this process's flights leaves the overlay (and the board)."""
        self.pending.remove(flight)
        if self.board is not None:
            self.board.free(flight)

    def _unpend(self, flight: Flight) -> None:
        self._drop(flight)
        landed = self._landed.get(flight.worker)
        if landed is not None:
            landed.pop(flight, None)
            if not landed:
                del self._landed[flight.worker]

    async def _hold(self, ctx: RequestContext, pre: WorkerState, flight: Flight, leader: Flight) -> _Hold:
        """Wait for `leader`, and for whoever takes over from it should it fail, until the request's
        `hold_until` (max_wait_s after it was first held, over all its attempts)."""
        loop = asyncio.get_running_loop()
        if ctx.hold_until is None:
            ctx.hold_until = loop.time() + self.cfg.max_wait_s
        hold = _Hold(ctx, pre, flight)
        self._enlist(hold, leader)
        pre.inflight += 1  # a held request is load on the worker it waits for
        self.holding += 1
        t0 = time.perf_counter()
        reason = "cancelled"  # the client went away or the request timed out while held
        try:
            while hold.verdict is None:  # each leader's end sets the verdict or moves it to another leader
                left = ctx.hold_until - loop.time()
                if left <= 0:
                    raise TimeoutError
                assert hold.fut is not None
                await asyncio.wait_for(asyncio.shield(hold.fut), left)
            reason = hold.verdict
        except TimeoutError:
            # a verdict given as the time ran out stands (promoted: others wait for this one now)
            reason = hold.verdict or "timeout"
            hold.verdict = reason
        finally:
            self._delist(hold)
            pre.inflight -= 1
            self.holding -= 1
            self.held.labels(reason).inc()
            self.wait.observe(time.perf_counter() - t0)
        ctx.coalesced = reason
        return hold

    def _enlist(self, hold: _Hold, leader: Flight) -> None:
        fut = self._futures.get(leader)
        if fut is None:  # resolved by the leader's `_flight_done`
            fut = self._futures[leader] = asyncio.get_running_loop().create_future()
        self._waited.setdefault(leader.worker, {})[leader] = leader.tag
        self._queue.setdefault(leader, {})[hold] = None
        hold.leader, hold.fut = leader, fut
        if isinstance(leader.tag, Remote) and self._poll is None:
            self._poll = asyncio.ensure_future(self._watch())

    # ---- the other router processes' flights (router/fleet/shared_flights.py) -----------------------------
    def sync(self, workers: Sequence[str] = (), hashes: Sequence[int] = ()) -> None:
        """The mirror of the other processes' flights brought up to date (before a routing decision),
        and those on `workers` that a chain starting as `hashes` may share blocks with in the overlay."""
        board = self.board
        if board is not None:
            board.sync(self.pending, self._leader_done, self._remote_failed, CLIENT)
            for url in workers if hashes else ():
                board.materialize(self.pending, url, hashes)

    @staticmethod
    def _remote_failed(flight: Flight) -> AttemptFailed:
        return AttemptFailed("coalesce_rerouted", flight.worker, "the request computing its prefix (in another "
                             "router process) failed on the worker")

    def worker_down(self, url: str) -> None:
        """This process took `url` out (unhealthy: router/control/health.py; removed: follow.py
        `forget_worker`): requests held here for another process's flight there are tried elsewhere
        now, as for a flight of this process, whose connection was closed (upstreams.drop)."""
        if self.board is not None:
            self.board.fail_worker(url, self._remote_failed)

    async def _watch(self) -> None:
        """While a request here waits for another process's flight: the board every POLL_S (that
        process publishes the landing at the flight's first byte; KV events would say it later).
        A look that raises is logged (once) and the next one tried: a watch that ended would leave
        every such request held until its max_wait_s."""
        logged = False
        try:
            while any(isinstance(f.tag, Remote) for f in self._futures):
                await asyncio.sleep(POLL_S)
                try:
                    self.sync()
                except Exception:
                    if not logged:
                        log.exception("coalesce: reading the flight board failed")
                        logged = True
        finally:
            self._poll = None

    def close(self) -> None:
        """The router stops: the watch ends, this process's flights leave the board."""
        if self._poll is not None:
            self._poll.cancel()
        if self.board is not None:
            self.board.close()

    def _delist(self, hold: _Hold) -> None:
        leader, hold.leader = hold.leader, None
        queue = self._queue.get(leader) if leader is not None else None
        if queue is not None:
            queue.pop(hold, None)
            if not queue:
                del self._queue[leader]  # type: ignore[arg-type]

    def _leader_done(self, leader: Flight, state: str) -> None:
        fut = self._futures.pop(leader, None)
        waited = self._waited.get(leader.worker)
        if waited is not None:
            waited.pop(leader, None)
            if not waited:
                del self._waited[leader.worker]
        queue = self._queue.pop(leader, None)
        if queue:
            holds = list(queue)
            for hold in holds:
                hold.leader = None
            if state == LANDED:
                for hold in holds:
                    hold.verdict = "landed"
            else:
                self._promote(leader, holds)
        if fut is not None and not fut.done():
            fut.set_result(state)

    def _promote(self, leader: Flight, holds: list[_Hold]) -> None:
        """`leader` failed with requests held for it (first held first). Its worker's failure (an
        AttemptFailed, or the worker went away): they are tried elsewhere - not sent one after another
        to a worker that is failing them. An unexpected error: all released, as nobody knows what it
        says of the others. Otherwise (its client went away, a 4xx) the first that can still go (its
        client there, time left, its own landing heard soon) is promoted: it takes over the failed
        leader's blocks and is sent - or, when another live flight still computes a part of its prompt
        that it waited for through the failed one, waits for that first; the others take over what is
        left of theirs and wait for whoever now computes their shared part (the promoted one, usually),
        each until its own hold_until."""
        now = asyncio.get_running_loop().time()
        cause = leader.cause
        if isinstance(cause, AttemptFailed) or worker_gone(holds[0].pre):
            for hold in holds:
                if isinstance(cause, AttemptFailed):
                    hold.exclude = cause.worker
                if hold.ctx.attempts <= self.max_retries:
                    hold.verdict = "rerouted"
                    self.rerouted += hold.can_go(now)
                else:
                    hold.verdict = "leader_failed"  # no retry left: it goes to the worker itself
            return
        live = [h for h in holds if h.can_go(now)] if cause in (CLIENT, ANSWER) else []
        for hold in holds:
            if not hold.can_go(now):  # out of time (goes itself), or cancelled (its task raises)
                hold.verdict = "timeout" if hold.task is None or not hold.task.cancelling() else "cancelled"
            elif not live:
                hold.verdict = "leader_failed"
        first = next((h for h in live if self._lands_in_time(h.flight, h.flight.worker)), None)
        if first is None:
            for hold in live:
                hold.verdict = "leader_failed"
            return
        order = [first] + [h for h in live if h is not first]
        # the promoted one takes the failed leader's blocks in its chain, the others what is left in theirs
        self.pending.hand_over(leader, [h.flight for h in order])
        cpt = self.chars_per_token()
        enough = hold_blocks(self.block_chars, cpt, self.cfg)
        for hold in order:
            if self.board is not None:
                self.board.materialize(self.pending, hold.flight.worker, hold.flight.hashes)
            nxt, computing = self.pending.leader(hold.flight.worker, hold.flight.hashes, exclude=hold.flight,
                                                 limit=enough)
            if should_hold(nxt, computing, self.block_chars, cpt, self.cfg) and \
                    self._lands_in_time(nxt, hold.flight.worker):
                assert nxt is not None
                self._enlist(hold, nxt)  # the promoted one too, when a flight below still computes
                continue
            if hold is first:
                hold.verdict = "promoted"
                self.promoted += 1
            else:
                hold.verdict = "leader_failed"
            if self.board is not None:  # it computes what it took over: the other processes hear it
                self.board.claim(hold.flight, self.held_blocks(hold.ctx))

    def kv_batch(self, worker: str) -> None:
        """A KV event batch from `worker` was applied: the flights there that landed leave the overlay
        once the worker's events cover them - the exact index holds the prompt (its stores came), or
        the worker's cache was cleared or its stream started again since the landing (from then on the
        events say what it holds); a leader someone waits for whose whole prompt the worker's stores
        now hold (in HBM) has landed. Only those flights of that worker are looked at (usually none).

        Not simply at the first batch after the landing: that batch need not have the prompt's stores
        in it. SGLang inserts a prompt and streams its first token while it processes the step's
        results, and publishes the queued events only with a later step's stats (`_publish_kv_events`
        at the end of `log_prefill_stats`, and of `log_decode_stats` every `decode_log_interval` decode
        steps); with the overlap scheduler the batch published as the next step is scheduled, just
        before, holds only older events. They travel over ZMQ, the token over HTTP, and a worker with
        attention DP publishes one stream per rank: a batch of other requests' blocks, or another
        rank's, can arrive between the first byte and the stores. Dropped there, the prompt counted as
        held nowhere until its stores came, and the next turn or a burst's followers went elsewhere."""
        landed = self._landed.get(worker)
        kv = self.kv
        if landed:  # the worker's events speak for these once they cover them
            if kv is None:
                gone = list(landed)
            else:
                marks, gone = kv.marks(worker), []
                for f, seen in landed.items():
                    if seen[0] != marks[0]:
                        gone.append(f)  # cleared or started again: what it holds now is in the events
                    elif seen[1] != marks[1]:  # stores came since it was last looked at (only they add)
                        where = self._stored(f)
                        if where == "hbm":
                            gone.append(f)
                        elif where is not None:  # else (a replay, an untrusted rank) looked at again later
                            landed[f] = marks
            for flight in gone:
                del landed[flight]
                self._drop(flight)
            if not landed:
                del self._landed[worker]
        waited = self._waited.get(worker)
        published = self._kv_landing.get(worker)
        if not (waited or published) or kv is None:
            return
        both = [*waited.items()] if waited else []
        if published:  # the oldest first, a few a batch: a worker prefills about in arrival order (fcfs)
            both += [(f, c) for f, c in itertools.islice(published.items(), KV_LANDING_CHECKS)
                     if not waited or f not in waited]
        for leader, ctx in both:
            if not isinstance(ctx, RequestContext):
                continue  # another process's flight: that process says when it landed (the board)
            if kv.residency(ctx.hashes, ctx.text, worker, kv.kind(ctx.endpoint, ctx.body), ctx.body) == "hbm":
                leader.land()

    def counters(self) -> dict[str, int]:
        """The per-process counts of `status_doc` (/admin/status sums them over the router's processes,
        each process writing its own once a second: router/scaleout/metrics_merge.py)."""
        return {"holding": self.holding, "leaders_waited_for": sum(len(v) for v in self._waited.values()),
                "promoted": self.promoted, "rerouted": self.rerouted}

    def status_doc(self) -> dict[str, Any]:
        self.sync()  # the other processes' flights as they are now, not as at this process's last decision
        board = self.board
        return {"enabled": self.cfg.enabled, "min_tokens": self.cfg.min_tokens, "max_wait_s": self.cfg.max_wait_s,
                **self.counters(), "pending_blocks": self.pending.snapshot(),
                **({"board": board.status_doc()} if board is not None else {})}
