"""In-flight prefix coalescing: the blocks requests routed to a worker are computing right now, and
which in-flight request a new one should wait for (docs/router.md "In-flight prefix coalescing").

Why: a burst of requests sharing a new prefix (a tenant's system prompt) reaches a worker while the
first of them is still prefilling it. SGLang 0.5.23's default scheduling (`--schedule-policy fcfs`)
matches each request's prefix when it is scheduled, so every request that shares the first prefill
batch computes the prefix again (only `lpm` dedups in a batch: IN_BATCH_PREFIX_CACHING_* in
python/sglang/srt/managers/schedule_policy.py). Two parts:

- `PendingBlocks`, the pending overlay: per worker, the block chains of the prompts in flight there,
  refcounted, so placement counts them as held before the worker's KV events report them stored.
  Every entry is a whole chain from the root (a prompt's blocks 0..n-1), so a worker's entries stay
  prefix-closed and the depth of a prompt is a binary search, as in core/routing/index.py. Each block
  remembers the flight that computes it (its `owner`): the first flight that needed it while no live
  flight was computing it and the worker did not hold it.
- `Flight`: one attempt of one request on one worker: computing until its blocks landed (its first
  byte or answer, or the worker's KV events), then landed; failed when it ended without landing.
  When a leader fails, one of its followers can take its place (`hand_over`: the failed flight's
  blocks in its chain become its own) and the others wait for it (`leader(..., exclude=)`: the flight
  computing a follower's shared part, not the follower itself).

Pure: no clock, no I/O, no asyncio; the router (router/request/coalesce.py) waits and times.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

COMPUTING, LANDED, FAILED = "computing", "landed", "failed"
#: the order of a flight's end and a flight's queueing (`PendingBlocks.add_later`): a queued flight joins
#: the overlay as it would have when it was queued, whatever ended since
_ORDER = itertools.count(1)


@dataclass(frozen=True, kw_only=True)
class CoalesceConfig:
    """enabled, min_tokens and max_wait_s are the router's coalesce settings (profile/router.py
    RouterCoalesce declares their defaults; router/config.py `coalesce_config` builds this): no default here."""

    enabled: bool
    #: the shared part still being computed, in prompt tokens, worth waiting for
    min_tokens: int
    #: the longest a follower waits for its leader's blocks (then it computes them itself)
    max_wait_s: float
    #: how long a finished request's blocks stay pending: for the worker's KV events to arrive
    grace_s: float = 1.0

    def __post_init__(self) -> None:
        if self.min_tokens < 1:
            raise ValueError(f"coalesce.min_tokens must be >= 1, got {self.min_tokens}")
        if not self.max_wait_s > 0:
            raise ValueError(f"coalesce.max_wait_s must be > 0, got {self.max_wait_s}")
        if self.grace_s < 0:
            raise ValueError(f"coalesce.grace_s must be >= 0, got {self.grace_s}")


class Flight:
    """One attempt's prompt on one worker. `on_done` (set by the router when someone waits) hears the
    one transition out of computing."""

    __slots__ = ("added", "cause", "ended", "first", "hashes", "on_done", "state", "tag", "worker")

    def __init__(self, worker: str, hashes: Sequence[int], tag: object = None) -> None:
        self.worker = worker
        self.hashes = hashes
        #: the caller's own (the router: the request), never read here
        self.tag = tag
        self.state = COMPUTING
        #: when it stopped computing, in `_ORDER` (inf while it computes)
        self.ended: float = math.inf
        #: why it failed (the caller's own, given to `fail`; the router: who to blame), never read here
        self.cause: object = None
        self.on_done: Callable[[str], None] | None = None
        #: whether its chain is in the overlay, or queued to join it (`PendingBlocks.add_later`);
        #: removed exactly once
        self.added = False
        #: the first block it computes itself, as `PendingBlocks.add` found (its chain's length until then)
        self.first = len(hashes)

    @property
    def computing(self) -> bool:
        return self.state == COMPUTING

    def land(self) -> bool:
        """Its blocks are on the worker (first byte, answer or KV events). True when this changed it."""
        return self._end(LANDED)

    def fail(self, cause: object = None) -> bool:
        """It ended without its blocks landing (error, 4xx, client gone). True when this changed it;
        `cause` is kept (set before `on_done` hears it) only then."""
        if self.state == COMPUTING:
            self.cause = cause
        return self._end(FAILED)

    def _end(self, state: str) -> bool:
        if self.state != COMPUTING:
            return False
        self.state = state
        self.ended = next(_ORDER)
        if self.on_done is not None:
            self.on_done(state)
        return True


class _Pending:
    """One worker's pending blocks: how many flights reference each, and the live or last flight computing
    it where one does (a block the worker held at a decision has none). Two plain dicts, not an object per
    block: `add` and `remove` walk a whole prompt's chain on every request (120 blocks for a 1,200-word
    system prompt: 25-40 µs with an object per block, docs/benchmarks.md "session 12")."""

    __slots__ = ("owners", "refs")

    def __init__(self) -> None:
        self.refs: dict[int, int] = {}
        self.owners: dict[int, Flight] = {}


class PendingBlocks:
    """The pending overlay: per worker, block chain hash -> (flights referencing it, its computer)."""

    def __init__(self) -> None:
        self._by_worker: dict[str, _Pending] = {}
        #: flights queued to join (`add_later`), applied before any other use of the overlay (`settle`)
        self._later: list[tuple[Flight, int, int]] = []

    def add_later(self, flight: Flight, held_blocks: int) -> None:
        """`add`, applied at the next use of the overlay or `settle`, whichever comes first: the router
        enters a flight after its upstream write (a 1,200-word prompt's chain is ~120 dict updates, off
        the request's time to first token). Every method here applies the queue first, so no reader
        ever misses a queued flight; `flight.added` is already true, so a `remove` in between applies
        it and takes it out again. It joins as it would have now: a flight that ends meanwhile (its
        leader, landing in the same turn) still computes its blocks for it - joined later, it took the
        landed blocks as its own to compute, and the next request for them waited for its first byte."""
        if flight.added:
            return
        flight.added = True
        self._later.append((flight, held_blocks, next(_ORDER)))

    def settle(self) -> None:
        """Apply the flights `add_later` queued, in their order."""
        later, self._later = self._later, []
        for flight, held_blocks, since in later:
            flight.added = False
            self._add(flight, held_blocks, since)

    def depth(self, worker: str, hashes: Sequence[int]) -> int:
        """Blocks of `hashes` (from the root) pending on `worker`: binary search on the prefix-closed
        entries."""
        if self._later:
            self.settle()
        w = self._by_worker.get(worker)
        if w is None or not hashes:
            return 0
        refs = w.refs
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in refs:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def leader(self, worker: str, hashes: Sequence[int], exclude: Flight | None = None,
               limit: int | None = None) -> tuple[Flight | None, int]:
        """The flight computing the deepest block `hashes` shares with the flights on `worker`, and
        how many of the shared blocks are still being computed by live flights (the contiguous run
        ending at the deepest shared block, counted up to `limit`). (None, 0) when nothing shared is
        being computed. `exclude`: a flight whose own chain `hashes` is (a held follower): its own
        blocks (the tail it computes itself) are skipped, the answer is the flight it waits for."""
        d = self.depth(worker, hashes)
        if d == 0:
            return None, 0
        owner_of = self._by_worker[worker].owners.get
        top_i = d - 1
        while exclude is not None and top_i >= 0 and owner_of(hashes[top_i]) is exclude:
            top_i -= 1
        if top_i < 0:
            return None, 0
        top = owner_of(hashes[top_i])
        if top is None or not top.computing:
            return None, 0
        n = 0
        for i in range(top_i, -1, -1):
            owner = owner_of(hashes[i])
            if owner is None or not owner.computing or owner is exclude:
                break
            n += 1
            if n == limit:
                break
        return top, n

    def add(self, flight: Flight, held_blocks: int) -> int:
        """`flight`'s chain becomes pending on its worker. Its blocks from `held_blocks` on (what the
        worker did not hold at the decision) it computes itself unless a live flight already does.
        Returns the index of the first block it computes (the chain's length when none): the blocks
        before it are the worker's or another flight's (the flight board publishes that much as held,
        router/fleet/shared_flights.py, so that another process never takes a held follower for the
        flight computing its leader's blocks)."""
        if self._later:
            self.settle()
        return self._add(flight, held_blocks, math.inf)

    def _add(self, flight: Flight, held_blocks: int, since: float) -> int:
        """`add`, as at `since` (in `_ORDER`): a flight that ended after it still computes its blocks."""
        hashes = flight.hashes
        if flight.added:
            return len(hashes)
        w = self._by_worker.get(flight.worker)
        if w is None:
            w = self._by_worker[flight.worker] = _Pending()
        refs, owners = w.refs, w.owners
        get = refs.get
        n = first = len(hashes)
        held = max(0, held_blocks)
        for h in hashes[:held]:  # the request path's loop, every request: the held part only counts
            refs[h] = get(h, 0) + 1
        for i in range(min(held, n), n):  # the part the worker did not hold: computed by a live flight
            h = hashes[i]
            refs[h] = get(h, 0) + 1
            owner = owners.get(h)
            if owner is None or owner.ended < since:
                owners[h] = flight
                if first == n:
                    first = i
        flight.added = True
        flight.first = first
        return first

    def claim(self, flight: Flight, held_blocks: int) -> int:
        """`flight` (added) computes its blocks from `held_blocks` on that no live flight computes: a
        follower promoted in another router process, which takes over its failed leader's blocks
        there (`hand_over`) and says so on the flight board. Returns how many blocks it took."""
        if self._later:
            self.settle()
        w = self._by_worker.get(flight.worker)
        if w is None or not flight.added or not flight.computing:
            return 0
        refs, owners = w.refs, w.owners
        n = 0
        for h in flight.hashes[max(0, held_blocks):]:
            if h not in refs:
                continue
            owner = owners.get(h)
            if owner is not flight and (owner is None or not owner.computing):
                owners[h] = flight
                n += 1
        return n

    def hand_over(self, failed: Flight, heirs: Sequence[Flight]) -> int:
        """`failed` (not yet removed) computed blocks its followers `heirs` (added, on its worker)
        need: each block goes to the first heir whose chain holds it - a follower promoted to compute
        the prefix its leader failed to, then the others for what is left in theirs. Blocks the
        worker held at a decision (no owner) and other flights' stay as they are. O(the failed
        chain + heirs x log): a chain's hashes cover everything before them, so the part an heir
        shares with `failed` is a binary search. Returns how many blocks changed hands."""
        if self._later:
            self.settle()
        w = self._by_worker.get(failed.worker)
        if w is None or not failed.added:
            return 0
        owners = w.owners
        mine, done, n = failed.hashes, 0, 0
        for heir in heirs:
            if not heir.added or heir.worker != failed.worker:
                continue
            theirs = heir.hashes
            lo, hi = 0, min(len(mine), len(theirs))
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if mine[mid - 1] == theirs[mid - 1]:
                    lo = mid
                else:
                    hi = mid - 1
            for i in range(done, lo):
                if owners.get(mine[i]) is failed:
                    owners[mine[i]] = heir
                    n += 1
            done = max(done, lo)
        return n

    def remove(self, flight: Flight) -> None:
        """`flight`'s chain is no longer pending (its request ended, plus the grace; or it failed)."""
        if self._later:
            self.settle()
        if not flight.added:
            return
        flight.added = False
        w = self._by_worker.get(flight.worker)
        if w is None:
            return
        refs, owners = w.refs, w.owners
        get = refs.get
        for h in flight.hashes:
            r = get(h)
            if r is None:
                continue
            if r <= 1:
                del refs[h]
                owners.pop(h, None)
            else:
                refs[h] = r - 1
                if owners.get(h) is flight:
                    del owners[h]
        if not refs:
            del self._by_worker[flight.worker]

    def blocks(self, worker: str) -> int:
        if self._later:
            self.settle()
        w = self._by_worker.get(worker)
        return len(w.refs) if w is not None else 0

    def snapshot(self) -> dict[str, int]:
        """Pending blocks per worker (`router status`)."""
        if self._later:
            self.settle()
        return {w: len(p.refs) for w, p in self._by_worker.items()}


def should_hold(leader: Flight | None, computing_blocks: int, block_chars: int, chars_per_token: float,
                cfg: CoalesceConfig) -> bool:
    """Whether a request waits for `leader`: coalescing is on, a live flight on the same worker is
    computing a shared part of at least `min_tokens` (blocks in routing-text characters, converted
    with the router's chars-per-token estimate)."""
    if not cfg.enabled or leader is None or not leader.computing:
        return False
    return computing_blocks * block_chars / max(chars_per_token, 0.1) >= cfg.min_tokens


def hold_blocks(block_chars: int, chars_per_token: float, cfg: CoalesceConfig) -> int:
    """A count of computing blocks past which `should_hold` says yes whatever the rest (a `limit` for
    `PendingBlocks.leader`: counting further changes nothing)."""
    return math.ceil(cfg.min_tokens * max(chars_per_token, 0.1) / block_chars) + 1
