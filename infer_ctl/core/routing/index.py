"""Approximate prefix-cache index: a radix tree over fixed-size character blocks of the rendered prompt.

Why blocks: a node of this tree is identified by the chained hash of every block from the root, so the
tree is a dict from chain hash to the workers that (we predict) hold that prefix. Walking a 24k-char
prompt costs one hash per 64 characters instead of one Python step per character, and lookups are
O(log blocks) per worker by binary search (see `match`). The last, partial block is never indexed:
matching granularity is `block_chars`, much finer than any prefix worth routing on.

Why per-worker LRU order: each worker's entries live in an OrderedDict ordered by last use. `insert`
touches a path leaf-first, so a parent is always at least as recent as its children and eviction (TTL,
per-worker capacity, global cap) always removes leaves before their parents: a worker's entries stay
prefix-closed, which is what makes the binary search in `match` valid.

Time is passed in (`now`, seconds on any monotonic clock); nothing here reads a clock.

Why `insert_later`: the request path predicts after its upstream write (router/request/picker.py),
and every other use of the index first applies what was deferred (`settle`), so nothing ever reads
or changes the index out of order.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

ROOT = 0x5EED_B10C


#: characters per block of the routing indexes (the predicted index here, the exact index's anchors,
#: core/routing/anchors.py): a constant of the router, not a setting
BLOCK_CHARS = 64


def block_hashes(text: str, block_chars: int) -> list[int]:
    """Chain hashes of the full blocks of `text`: hashes[i] identifies text[: (i+1) * block_chars]."""
    out: list[int] = []
    prev = ROOT
    for start in range(0, len(text) - block_chars + 1, block_chars):
        prev = hash((prev, text[start : start + block_chars]))
        out.append(prev)
    return out


class PrefixIndex:
    """Which worker holds which prompt prefix, predicted from routing decisions and corrected by
    feedback (actual cached tokens, restarts, flushes, health)."""

    def __init__(self, *, ttl_s: float, max_blocks: int, block_chars: int = BLOCK_CHARS) -> None:
        """`ttl_s` and `max_blocks` come from the router's prefix_ttl_s and index_max_tokens settings
        (router/config.py `prefix_index`): no default here."""
        if block_chars < 1:
            raise ValueError("block_chars must be >= 1")
        self.block_chars = block_chars
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._by_worker: dict[str, OrderedDict[int, float]] = {}
        #: optional per-worker cap in blocks, mirroring the worker's own KV capacity
        self._capacity: dict[str, int] = {}
        self._total = 0
        self.evicted = 0
        self.expired = 0
        #: `insert_later`'s inserts, applied in order before any other use of the index (`settle`)
        self._later: deque[tuple[Sequence[int], str, float]] = deque()

    # ---- queries ------------------------------------------------------------------------------
    def hashes(self, text: str) -> list[int]:
        return block_hashes(text, self.block_chars)

    def match(self, hashes: Sequence[int], workers: Iterable[str], now: float) -> dict[str, int]:
        """Matched prefix length in characters, per worker (0 when nothing matches)."""
        if self._later:
            self.settle()
        out: dict[str, int] = {}
        cutoff = now - self.ttl_s
        for worker in workers:
            entries = self._by_worker.get(worker)
            if not entries or not hashes:
                out[worker] = 0
                continue
            lo, hi = 0, len(hashes)  # invariant: hashes[:lo] present (prefix-closed), hashes[hi:] not
            while lo < hi:
                mid = (lo + hi + 1) // 2
                seen = entries.get(hashes[mid - 1])
                if seen is not None and seen >= cutoff:
                    lo = mid
                else:
                    hi = mid - 1
            out[worker] = lo * self.block_chars
        return out

    def footprint(self, worker: str) -> int:
        """Predicted cached characters on `worker`."""
        if self._later:
            self.settle()
        entries = self._by_worker.get(worker)
        return len(entries) * self.block_chars if entries else 0

    def workers(self) -> list[str]:
        if self._later:
            self.settle()
        return list(self._by_worker)

    def capacity(self, worker: str) -> int | None:
        """`worker`'s cap in blocks (`set_capacity`; None: only the global cap)."""
        if self._later:
            self.settle()
        return self._capacity.get(worker)

    def __len__(self) -> int:
        if self._later:
            self.settle()
        return self._total

    # ---- updates ------------------------------------------------------------------------------
    def insert(self, hashes: Sequence[int], worker: str, now: float) -> None:
        """`worker` holds the prefix `hashes` from `now` on. Only the first blocks that fit its capacity
        (and the global cap) are inserted: the rest would be evicted by this very insert, and a prompt
        longer than the worker's whole cache cannot be cached whole."""
        if self._later:
            self.settle()
        self._insert(hashes, worker, now)

    def _insert(self, hashes: Sequence[int], worker: str, now: float) -> None:
        cap = self._capacity.get(worker)
        room = self.max_blocks if cap is None else min(cap, self.max_blocks)
        if len(hashes) > room:
            hashes = hashes[:room]
        entries = self._by_worker.get(worker)
        if entries is None:
            entries = self._by_worker[worker] = OrderedDict()
        before = len(entries)
        for h in reversed(hashes):  # leaf first: parents end up more recent than children
            entries[h] = now
            entries.move_to_end(h)
        self._total += len(entries) - before
        if cap is not None:
            while len(entries) > cap:
                entries.popitem(last=False)
                self._total -= 1
                self.evicted += 1
        while self._total > self.max_blocks:
            self._evict_globally_oldest()

    def insert_later(self, hashes: Sequence[int], worker: str, now: float) -> None:
        """`insert`, applied before the index is next read or changed (or by `settle`, which the caller
        schedules): the request path defers its prediction past its upstream write."""
        self._later.append((hashes, worker, now))

    def settle(self) -> None:
        """Apply the deferred inserts now, one at a time: an insert that raises loses only itself (the
        rest stay queued for the next use), and one deferred meanwhile is applied too, never dropped."""
        later = self._later
        while later:  # `_insert`: `insert` would settle the rest first, out of order
            hashes, worker, now = later.popleft()
            self._insert(hashes, worker, now)

    def last_use(self, block: int, worker: str) -> float | None:
        """When `worker`'s entry `block` was last used (None: not held)."""
        if self._later:
            self.settle()
        entries = self._by_worker.get(worker)
        return entries.get(block) if entries else None

    def forget_older(self, worker: str, seen: float) -> int:
        """Feedback: `worker` evicted an entry last used at `seen`. An LRU cache evicts older entries
        first, so every entry of the worker used no later than that is gone too. Returns entries dropped."""
        if self._later:
            self.settle()
        entries = self._by_worker.get(worker)
        dropped = 0
        while entries:
            h, t = next(iter(entries.items()))
            if t > seen:
                break
            del entries[h]
            dropped += 1
        self._total -= dropped
        return dropped

    def drop_worker(self, worker: str) -> int:
        """The worker restarted, was flushed, went unhealthy or was removed: its cache is gone."""
        if self._later:
            self.settle()
        entries = self._by_worker.pop(worker, None)
        n = len(entries) if entries else 0
        self._total -= n
        return n

    def set_capacity(self, worker: str, blocks: int | None) -> None:
        if self._later:
            self.settle()
        if blocks is None:
            self._capacity.pop(worker, None)
        else:
            self._capacity[worker] = max(1, blocks)

    def expire(self, now: float) -> int:
        """Remove entries idle longer than the TTL (oldest first; stops at the first fresh one)."""
        if self._later:
            self.settle()
        cutoff = now - self.ttl_s
        removed = 0
        for worker, entries in list(self._by_worker.items()):
            while entries:
                h, seen = next(iter(entries.items()))
                if seen >= cutoff:
                    break
                del entries[h]
                removed += 1
            if not entries:
                del self._by_worker[worker]
        self._total -= removed
        self.expired += removed
        return removed

    def _evict_globally_oldest(self) -> None:
        oldest_worker = None
        oldest = float("inf")
        for worker, entries in self._by_worker.items():
            if entries:
                seen = next(iter(entries.values()))
                if seen < oldest:
                    oldest, oldest_worker = seen, worker
        if oldest_worker is None:
            self._total = 0
            return
        self._by_worker[oldest_worker].popitem(last=False)
        self._total -= 1
        self.evicted += 1
