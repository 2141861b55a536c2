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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

COMPUTING, LANDED, FAILED = "computing", "landed", "failed"


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

    __slots__ = ("added", "cause", "hashes", "on_done", "state", "tag", "worker")

    def __init__(self, worker: str, hashes: Sequence[int], tag: object = None) -> None:
        self.worker = worker
        self.hashes = hashes
        #: the caller's own (the router: the request), never read here
        self.tag = tag
        self.state = COMPUTING
        #: why it failed (the caller's own, given to `fail`; the router: who to blame), never read here
        self.cause: object = None
        self.on_done: Callable[[str], None] | None = None
        #: whether its chain is in the overlay (removed exactly once)
        self.added = False

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
        if self.on_done is not None:
            self.on_done(state)
        return True


class _Entry:
    __slots__ = ("owner", "refs")

    def __init__(self, owner: Flight | None) -> None:
        self.refs = 0
        self.owner = owner


class PendingBlocks:
    """The pending overlay: per worker, block chain hash -> (flights referencing it, its computer)."""

    def __init__(self) -> None:
        self._by_worker: dict[str, dict[int, _Entry]] = {}

    def depth(self, worker: str, hashes: Sequence[int]) -> int:
        """Blocks of `hashes` (from the root) pending on `worker`: binary search on the prefix-closed
        entries."""
        entries = self._by_worker.get(worker)
        if not entries or not hashes:
            return 0
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in entries:
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
        entries = self._by_worker[worker]
        top_i = d - 1
        while exclude is not None and top_i >= 0 and entries[hashes[top_i]].owner is exclude:
            top_i -= 1
        if top_i < 0:
            return None, 0
        top = entries[hashes[top_i]].owner
        if top is None or not top.computing:
            return None, 0
        n = 0
        for i in range(top_i, -1, -1):
            owner = entries[hashes[i]].owner
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
        if flight.added:
            return len(flight.hashes)
        entries = self._by_worker.setdefault(flight.worker, {})
        get = entries.get
        n = first = len(flight.hashes)
        for i, h in enumerate(flight.hashes):  # the request path's loop: every request, every block
            e = get(h)
            if e is None:
                e = entries[h] = _Entry(flight if i >= held_blocks else None)
                if first == n and i >= held_blocks:
                    first = i
            elif i >= held_blocks and (e.owner is None or e.owner.state != COMPUTING):
                e.owner = flight
                if first == n:
                    first = i
            e.refs += 1
        flight.added = True
        return first

    def claim(self, flight: Flight, held_blocks: int) -> int:
        """`flight` (added) computes its blocks from `held_blocks` on that no live flight computes: a
        follower promoted in another router process, which takes over its failed leader's blocks
        there (`hand_over`) and says so on the flight board. Returns how many blocks it took."""
        entries = self._by_worker.get(flight.worker)
        if entries is None or not flight.added or not flight.computing:
            return 0
        n = 0
        for h in flight.hashes[held_blocks:]:
            e = entries.get(h)
            if e is not None and e.owner is not flight and (e.owner is None or not e.owner.computing):
                e.owner = flight
                n += 1
        return n

    def hand_over(self, failed: Flight, heirs: Sequence[Flight]) -> int:
        """`failed` (not yet removed) computed blocks its followers `heirs` (added, on its worker)
        need: each block goes to the first heir whose chain holds it - a follower promoted to compute
        the prefix its leader failed to, then the others for what is left in theirs. Blocks the
        worker held at a decision (no owner) and other flights' stay as they are. O(the failed
        chain + heirs x log): a chain's hashes cover everything before them, so the part an heir
        shares with `failed` is a binary search. Returns how many blocks changed hands."""
        entries = self._by_worker.get(failed.worker)
        if entries is None or not failed.added:
            return 0
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
                e = entries.get(mine[i])
                if e is not None and e.owner is failed:
                    e.owner = heir
                    n += 1
            done = max(done, lo)
        return n

    def remove(self, flight: Flight) -> None:
        """`flight`'s chain is no longer pending (its request ended, plus the grace; or it failed)."""
        if not flight.added:
            return
        flight.added = False
        entries = self._by_worker.get(flight.worker)
        if entries is None:
            return
        for h in flight.hashes:
            e = entries.get(h)
            if e is None:
                continue
            e.refs -= 1
            if e.refs <= 0:
                del entries[h]
            elif e.owner is flight:
                e.owner = None
        if not entries:
            del self._by_worker[flight.worker]

    def blocks(self, worker: str) -> int:
        entries = self._by_worker.get(worker)
        return len(entries) if entries else 0

    def snapshot(self) -> dict[str, int]:
        """Pending blocks per worker (`router status`)."""
        return {w: len(e) for w, e in self._by_worker.items()}


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
