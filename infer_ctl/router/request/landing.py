"""How a coalesced flight's landing is heard, and when a landed one leaves the pending overlay: the landing
walk of the coalescer (router/request/coalesce.py; docs/router.md "In-flight prefix coalescing").

A flight lands at its first streamed byte, at its whole answer, or - a unary request on a worker whose KV
events are trusted - when those events hold its whole prompt (`kv_batch`). A landed flight stays pending
until its worker's KV events cover it, at the latest for the grace, then leaves the overlay and the board.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from infer_ctl.core.routing.coalesce import LANDED, CoalesceConfig, Flight, PendingBlocks
from infer_ctl.core.tenancy.estimate import request_estimate
from infer_ctl.router.fleet.shared_flights import FAILED, FAILED_WORKER, FlightBoard, Remote
from infer_ctl.router.fleet.shared_flights import LANDED as BOARD_LANDED
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.retry import AttemptFailed

#: a leader whose prompt's landing the router only learns from its whole answer (not streamed, on a
#: worker without a trusted KV-event stream) is waited for only when that answer follows its prefill
#: closely: at most this many new tokens. A longer answer would hold the followers through the
#: leader's decode (up to max_wait_s) for a prefix that landed long before
LATE_LANDING_TOKENS = 16
#: published unary flights per KV batch whose landing `kv_batch` looks for (a residency lookup each,
#: several microseconds): a process's unary requests in flight on one worker can be many, and each
#: batch would look at every one; the oldest are the next to finish their prefill
KV_LANDING_CHECKS = 16


class Landings:
    def __init__(self, cfg: CoalesceConfig, pending: PendingBlocks, chars_per_token: Callable[[], float], *,
                 kv: KvRouting | None = None, board: FlightBoard | None = None) -> None:
        self.cfg = cfg
        self.pending = pending
        self.chars_per_token = chars_per_token
        #: the exact index and the flight board (the Coalescer's)
        self.kv = kv
        self.board = board
        #: published unary flights on exact workers, per worker, whose landing their worker's KV events
        #: may say before their answer: landed by `kv_batch` whether or not anyone here waits (another
        #: process's requests may, and only this process publishes the landing)
        self.kv_landing: dict[str, dict[Flight, RequestContext]] = {}
        #: flights that landed and are still pending, per worker (until the worker's events cover them),
        #: each with its worker's `kv.marks` when it landed or was last looked at
        self.landed: dict[str, dict[Flight, tuple[int, int]]] = {}

    def lands_in_time(self, leader: Flight | None, worker: str) -> bool:
        """Whether the router will hear soon after the leader's prefill that its blocks landed: its
        first streamed byte, its worker's KV events, or a whole answer of a few tokens (another
        process's flight: as that process published it)."""
        lctx = leader.tag if leader is not None else None
        if isinstance(lctx, Remote):
            return not lctx.late
        if not isinstance(lctx, RequestContext):
            return True
        return self.landing(lctx, worker) != "late"

    def landing(self, ctx: RequestContext, worker: str) -> str:
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

    def published(self, flight: Flight, ctx: RequestContext, landing: str) -> None:
        """A flight of this process was published on the board; `landing`: as `landing` says."""
        if landing == "kv":
            self.kv_landing.setdefault(flight.worker, {})[flight] = ctx

    def flight_done(self, flight: Flight, state: str) -> None:
        """After its waiters heard it (Coalescer._flight_done): failed, the flight leaves the overlay now;
        landed, it stays pending until its worker's KV events cover it (`kv_batch`) or, at the latest, for
        the grace (a worker without KV events)."""
        kl = self.kv_landing.get(flight.worker)
        if kl is not None and kl.pop(flight, None) is not None and not kl:
            del self.kv_landing[flight.worker]
        if self.board is not None:
            self.board.state(flight, BOARD_LANDED if state == LANDED else
                             FAILED_WORKER if isinstance(flight.cause, AttemptFailed) else FAILED)
        if not flight.added:
            return
        if state != LANDED or self.cfg.grace_s <= 0 or self.stored(flight) == "hbm":
            self.drop(flight)
            return
        kv = self.kv
        marks = kv.marks(flight.worker) if kv is not None else (0, 0)
        self.landed.setdefault(flight.worker, {})[flight] = marks
        asyncio.get_running_loop().call_later(self.cfg.grace_s, self._unpend, flight)

    def stored(self, flight: Flight) -> str | None:
        """Where the exact index holds the flight's whole prompt (hbm: its stores came; not 90 % of it,
        as for a leader's landing: a prompt whose shared part the worker held before would leave before
        its own tail was stored), None when it cannot tell (`kv.residency`)."""
        kv, ctx = self.kv, flight.tag
        if kv is None or not isinstance(ctx, RequestContext):
            return None
        return kv.residency(ctx.hashes, ctx.text, flight.worker, kv.kind(ctx.endpoint, ctx.body), ctx.body,
                            share=1.0)

    def drop(self, flight: Flight) -> None:
        """One of this process's flights leaves the overlay (and the board)."""
        self.pending.remove(flight)
        if self.board is not None:
            self.board.free(flight)

    def _unpend(self, flight: Flight) -> None:
        self.drop(flight)
        landed = self.landed.get(flight.worker)
        if landed is not None:
            landed.pop(flight, None)
            if not landed:
                del self.landed[flight.worker]

    def kv_batch(self, worker: str, waited: Mapping[Flight, Any] | None) -> None:
        """Coalescer.kv_batch (which says why); `waited`: the leaders on `worker` someone here waits for."""
        landed = self.landed.get(worker)
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
                        where = self.stored(f)
                        if where == "hbm":
                            gone.append(f)
                        elif where is not None:  # else (a replay, an untrusted rank) looked at again later
                            landed[f] = marks
            for flight in gone:
                del landed[flight]
                self.drop(flight)
            if not landed:
                del self.landed[worker]
        published = self.kv_landing.get(worker)
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
