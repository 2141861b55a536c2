"""The coalescer's leader/follower bookkeeping (router/request/coalesce.py): which held request waits for
which leader, the wait itself, and what each follower does when its leader ends - goes (landed), is tried
elsewhere (rerouted), takes over (promoted) or goes itself (leader_failed, timeout)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram

from infer_ctl.core.routing.coalesce import (
    LANDED,
    CoalesceConfig,
    Flight,
    PendingBlocks,
    hold_blocks,
    should_hold,
)
from infer_ctl.router.fleet.shared_flights import POLL_S, FlightBoard, Remote
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.landing import Landings
from infer_ctl.router.request.retry import AttemptFailed

log = logging.getLogger("infer_ctl.router")

#: why a flight failed (Flight.cause), besides the AttemptFailed of a failure the worker caused
CLIENT, ANSWER, ERROR = "client", "answer", "error"


def worker_gone(w: WorkerState) -> bool:
    return w.removed or not w.healthy or w.draining


class Hold:
    """One held request: what it waits for now (`leader`, `fut`), and once that ended for it, how
    (`verdict`: landed, promoted, rerouted, leader_failed, timeout). Set by Holds as leaders end; read by
    the held request's own task when it wakes."""

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


class Holds:
    def __init__(self, cfg: CoalesceConfig, pending: PendingBlocks, landings: Landings, *, block_chars: int,
                 chars_per_token: Callable[[], float], held_blocks: Callable[[RequestContext], int],
                 sync: Callable[[], None], held: Counter, wait: Histogram, max_retries: int,
                 enter: Callable[[], None], board: FlightBoard | None = None) -> None:
        self.cfg = cfg
        self.pending = pending
        self.landings = landings
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.held_blocks = held_blocks
        #: brings the mirror of the other processes' flights up to date (Coalescer.sync)
        self.sync = sync
        self.held, self.wait = held, wait
        self.max_retries = max_retries
        #: the flight board (the Coalescer's)
        self.board = board
        #: this turn's flights into the overlay and onto the board now (Coalescer._enter)
        self.enter = enter
        #: leaders someone waits for, per worker, with their request (the KV-events landing check)
        self.waited: dict[str, dict[Flight, Any]] = {}
        self.futures: dict[Flight, asyncio.Future[str]] = {}
        #: each waited-for leader's held requests, first held first (an ordered set)
        self.queue: dict[Flight, dict[Hold, None]] = {}
        #: followers promoted to compute a failed leader's prefix, and re-routed ones (since start)
        self.promoted = 0
        self.rerouted = 0
        self.holding = 0
        self._poll: asyncio.Task[None] | None = None

    async def hold(self, ctx: RequestContext, pre: WorkerState, flight: Flight, leader: Flight) -> Hold:
        """Wait for `leader`, and for whoever takes over from it should it fail, until the request's
        `hold_until` (max_wait_s after it was first held, over all its attempts)."""
        loop = asyncio.get_running_loop()
        if ctx.hold_until is None:
            ctx.hold_until = loop.time() + self.cfg.max_wait_s
        hold = Hold(ctx, pre, flight)
        self.enlist(hold, leader)
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

    def enlist(self, hold: Hold, leader: Flight) -> None:
        fut = self.futures.get(leader)
        if fut is None:  # resolved by the leader's `leader_done`
            fut = self.futures[leader] = asyncio.get_running_loop().create_future()
        self.waited.setdefault(leader.worker, {})[leader] = leader.tag
        self.queue.setdefault(leader, {})[hold] = None
        hold.leader, hold.fut = leader, fut
        if isinstance(leader.tag, Remote) and self._poll is None:
            self._poll = asyncio.ensure_future(self._watch())

    def _delist(self, hold: Hold) -> None:
        leader, hold.leader = hold.leader, None
        queue = self.queue.get(leader) if leader is not None else None
        if queue is not None:
            queue.pop(hold, None)
            if not queue:
                del self.queue[leader]  # type: ignore[arg-type]

    def leader_done(self, leader: Flight, state: str) -> None:
        """A flight's one transition out of computing: the requests held for it hear it."""
        fut = self.futures.pop(leader, None)
        waited = self.waited.get(leader.worker)
        if waited is not None:
            waited.pop(leader, None)
            if not waited:
                del self.waited[leader.worker]
        queue = self.queue.pop(leader, None)
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

    def _promote(self, leader: Flight, holds: list[Hold]) -> None:
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
        lands_in_time = self.landings.lands_in_time
        first = next((h for h in live if lands_in_time(h.flight, h.flight.worker)), None)
        if first is None:
            for hold in live:
                hold.verdict = "leader_failed"
            return
        order = [first] + [h for h in live if h is not first]
        if self.board is not None:
            # a follower held in this very turn is published only at its end (Coalescer._enter): published
            # first, so that its claim below finds its slot - else the claim was lost, and it was published
            # after as held up to where it first computed at its join, its leader's blocks taken elsewhere
            # for held while it computes them
            self.enter()
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
                    lands_in_time(nxt, hold.flight.worker):
                assert nxt is not None
                self.enlist(hold, nxt)  # the promoted one too, when a flight below still computes
                continue
            if hold is first:
                hold.verdict = "promoted"
                self.promoted += 1
            else:
                hold.verdict = "leader_failed"
            if self.board is not None:  # it computes what it took over: the other processes hear it
                self.board.claim(hold.flight, self.held_blocks(hold.ctx))

    async def _watch(self) -> None:
        """While a request here waits for another process's flight: the board every POLL_S (that
        process publishes the landing at the flight's first byte; KV events would say it later).
        A look that raises is logged (once) and the next one tried: a watch that ended would leave
        every such request held until its max_wait_s."""
        logged = False
        try:
            while any(isinstance(f.tag, Remote) for f in self.futures):
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
        if self._poll is not None:
            self._poll.cancel()
