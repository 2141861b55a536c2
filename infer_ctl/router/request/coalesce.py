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

The Coalescer wraps the attempts and ties two pieces together: the leader/follower bookkeeping
(router/request/holds.py) and the landing walk (router/request/landing.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

from infer_ctl.core.routing.coalesce import CoalesceConfig, Flight, PendingBlocks, should_hold
from infer_ctl.router.fleet.shared_flights import FlightBoard
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.holds import ANSWER, CLIENT, ERROR, Holds, worker_gone
from infer_ctl.router.request.landing import Landings
from infer_ctl.router.request.next_turn import NextTurn
from infer_ctl.router.request.retry import AttemptFailed

R = TypeVar("R")
Attempt = Callable[[RequestContext, WorkerState, WorkerState | None], Awaitable[R]]

_WAIT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
#: the routing text of a prompt that is pending (the overlay is unbounded otherwise: a 30 MB body,
#: under max_body_bytes, put 470,000 blocks, 43 MB and 1 s of the event loop into it). 512 KiB is
#: about 131,000 tokens at 4 characters a token, a long context's whole prompt; a prompt's first
#: blocks are a chain from the root, so the cut keeps each worker's entries prefix-closed
MAX_PENDING_CHARS = 512 * 1024


class Coalescer:
    def __init__(self, cfg: CoalesceConfig, *, block_chars: int, chars_per_token: Callable[[], float],
                 max_retries: int, registry: CollectorRegistry | None = None, kv: KvRouting | None = None,
                 board: FlightBoard | None = None) -> None:
        self.cfg = cfg
        self.block_chars = block_chars
        self.chars_per_token = chars_per_token
        self.pending = PendingBlocks()
        self.max_blocks = max(1, MAX_PENDING_CHARS // block_chars)
        #: the exact index (router/kvindex/kv_routing.py), for landing a leader on its worker's KV events;
        #: None: coalescing is off (the router keeps a coalescer that nothing calls)
        self.kv = kv
        #: several router processes sharing their flights: the flight board (router/fleet/shared_flights.py)
        self.board = board
        self.held = Counter("inferctl_router_coalesce_held_total",
                            "Requests held for an in-flight request computing their prefix, by how the hold "
                            "ended (landed, promoted: the leader failed and this one computes in its place, "
                            "rerouted: the leader's worker failed it, leader_failed, timeout, cancelled)",
                            ["reason"], registry=registry)
        self.wait = Histogram("inferctl_router_coalesce_wait_seconds",
                              "Time a request waited for an in-flight request computing its prefix (one "
                              "hold, through any leaders that took over)",
                              buckets=_WAIT, registry=registry)
        #: the landing walk: how a flight's landing is heard, and when a landed one leaves the overlay
        self.landings = Landings(cfg, self.pending, chars_per_token, kv=kv, board=board)
        #: the leader/follower bookkeeping. `max_retries`: the router's retries per request: a follower
        #: whose leader's worker failed is re-routed only while it has one left (else it goes to the worker
        #: itself, as without a hold)
        self.holds = Holds(cfg, self.pending, self.landings, block_chars=block_chars, chars_per_token=chars_per_token,
                           held_blocks=self.held_blocks, sync=self.sync, held=self.held, wait=self.wait,
                           max_retries=max_retries, board=board, enter=self._enter)
        #: this turn's flights for the board, published after the turn's upstream writes (`_enter`)
        self._to_publish: list[tuple[Flight, RequestContext, int]] = []
        #: `_enter` at the loop's next turn (router/request/next_turn.py)
        self._next_turn = NextTurn(self._enter)

    @property
    def holding(self) -> int:
        return self.holds.holding

    @property
    def promoted(self) -> int:
        return self.holds.promoted

    @property
    def rerouted(self) -> int:
        return self.holds.rerouted

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
        # the flight joins the overlay (and the board) after this turn's upstream write, off the request's
        # time to first token: every later reader of the overlay applies it first (PendingBlocks.add_later)
        self.pending.add_later(flight, held)
        if board is not None:
            self._to_publish.append((flight, ctx, held))
        self._next_turn.soon()  # `_enter` after this turn's upstream writes
        ctx.flight = flight
        try:
            if should_hold(leader, computing, self.block_chars, self.chars_per_token(), self.cfg) and \
                    (ctx.hold_until is None or asyncio.get_running_loop().time() < ctx.hold_until) and \
                    self.landings.lands_in_time(leader, pre.url):
                assert leader is not None
                hold = await self.holds.hold(ctx, pre, flight, leader)
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
            flight.fail(exc)  # the worker's failure: its followers are tried elsewhere
            raise
        except asyncio.CancelledError:
            flight.fail(CLIENT)  # client gone, request timeout: one follower takes over
            raise
        except BaseException:
            flight.fail(ERROR)
            raise
        # an answer without landing (a 4xx): one follower takes over. A flight that never landed fails
        # (its waiters are re-routed, or one of them takes over) and leaves the overlay now; a landed one
        # left it, or leaves it, as its worker's KV events say (`kv_batch`)
        flight.fail(ANSWER)
        return result

    def _enter(self) -> None:
        """The queued flights into the overlay, and those still computing on the flight board, published
        as held up to the first block each computes itself: a follower held here for a leader is never
        taken for the flight computing the leader's blocks in a third process. One that ended meanwhile
        is not published (its end freed nothing there: it would stay until its slot is needed)."""
        self.pending.settle()
        publish, self._to_publish = self._to_publish, []
        board = self.board
        for flight, ctx, held in publish:
            if board is None or not flight.computing:
                continue
            landing = self.landings.landing(ctx, flight.worker)
            self.landings.published(flight, ctx, landing)
            board.publish(flight, max(held, flight.first), late=landing == "late")

    def _flight_done(self, flight: Flight, state: str) -> None:
        """A flight's one transition out of computing: its waiters hear it (Holds.leader_done). Failed: it
        leaves the overlay now (after its blocks were handed over). Landed (its first byte or answer,
        or its worker's KV events): it stays pending until its worker's KV events cover it (`kv_batch`)
        or, at the latest, for the grace (a worker without KV events), not until its request ends. An
        overlay kept after the exact index has the prompt's stores would count as held a prompt the
        worker reports gone afterwards: measured in the stale benchmark (random direct traffic), where a
        session's next turn, sent as its previous turn ended, went to the worker that had just evicted
        it (0 cached) instead of one that held its system prompt."""
        self.holds.leader_done(flight, state)
        self.landings.flight_done(flight, state)

    # ---- the other router processes' flights (router/fleet/shared_flights.py) -----------------------------
    def sync(self, workers: Sequence[str] = (), hashes: Sequence[int] = ()) -> None:
        """The mirror of the other processes' flights brought up to date (before a routing decision),
        and those on `workers` that a chain starting as `hashes` may share blocks with in the overlay."""
        board = self.board
        if board is not None:
            board.sync(self.pending, self.holds.leader_done, _remote_failed, CLIENT)
            for url in workers if hashes else ():
                board.materialize(self.pending, url, hashes)

    def worker_down(self, url: str) -> None:
        """This process took `url` out (unhealthy: router/control/health.py; removed: follow.py
        `forget_worker`): requests held here for another process's flight there are tried elsewhere
        now, as for a flight of this process, whose connection was closed (upstreams.drop)."""
        if self.board is not None:
            self.board.fail_worker(url, _remote_failed)

    def close(self) -> None:
        """The router stops: the watch ends, this process's flights leave the board."""
        self.holds.close()
        if self.board is not None:
            self.board.close()

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
        self.landings.kv_batch(worker, self.holds.waited.get(worker))

    def counters(self) -> dict[str, int]:
        """The per-process counts of `status_doc` (/admin/status sums them over the router's processes,
        each process writing its own once a second: router/scaleout/metrics_merge.py)."""
        holds = self.holds
        return {"holding": holds.holding, "leaders_waited_for": sum(len(v) for v in holds.waited.values()),
                "promoted": holds.promoted, "rerouted": holds.rerouted}

    def status_doc(self) -> dict[str, Any]:
        self.sync()  # the other processes' flights as they are now, not as at this process's last decision
        board = self.board
        return {"enabled": self.cfg.enabled, "min_tokens": self.cfg.min_tokens, "max_wait_s": self.cfg.max_wait_s,
                **self.counters(), "pending_blocks": self.pending.snapshot(),
                **({"board": board.status_doc()} if board is not None else {})}


def _remote_failed(flight: Flight) -> AttemptFailed:
    return AttemptFailed("coalesce_rerouted", flight.worker, "the request computing its prefix (in another "
                         "router process) failed on the worker")
