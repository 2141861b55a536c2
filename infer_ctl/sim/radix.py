"""A token-level radix cache with a capacity, LRU eviction and SGLang's `priority` eviction policy.

Modelled on SGLang's `mem_cache/radix_cache.py`: edges hold token runs, a node's priority is the max
`priority` of the requests that inserted or matched through it and never decreases, only unlocked
leaves are evicted, and the `priority` policy evicts the lowest (priority, last_access) first while
`lru` evicts the least recently used. Access times are a logical counter, so eviction is deterministic.

As in SGLang, the tree holds whole pages (`page_size` tokens; a key is cut to whole pages before it is
matched or inserted, `RadixKey.page_aligned`), and an EAGLE worker's tree is keyed by bigrams (token i,
token i+1; `RadixKey.maybe_to_bigram_view`), so n prompt tokens are n - 1 keys. Lengths the cache
reports are in keys, each one token's KV. Bigrams are packed into one int each (`core.kvevents.hashing.pack_bigrams`).

Tokens enter and leave the tree only in `insert`, `evict` and `reset`: there a `KvEventRecorder` (when
the worker publishes KV events, `kv_events.py`) logs the stores, removals and clears (and `_split` its
splits, which change no block) that become `BlockStored`, `BlockRemoved` and `AllBlocksCleared`; the
HiCache tiers (host memory, storage: `tiers.HiRadixCache`) extend these points and `load_back`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from infer_ctl.core.kvevents.hashing import pack_bigrams

if TYPE_CHECKING:
    from infer_ctl.sim.kv_events import KvEventRecorder

EvictionPolicy = Literal["lru", "priority"]
#: a child's first key (page_size 1) or its first page of keys
ChildKey = int | tuple[int, ...]


@dataclass(eq=False)
class Node:
    key: list[int]
    parent: Node | None
    children: dict[ChildKey, Node] = field(default_factory=dict)
    priority: int = 0
    last_access: int = 0
    lock_ref: int = 0
    #: where the node's KV is (sim/tiers.py's HiCache tiers; a plain cache keeps everything on the device)
    on_device: bool = True
    on_host: bool = False
    on_storage: bool = False
    #: inserts and matches through the node (SGLang's hit_count: write_through_selective backs up at 2)
    hit_count: int = 0


@dataclass(frozen=True)
class MatchResult:
    length: int
    node: Node
    #: of `length`, the keys found only in host memory / only in storage (HiCache); the rest is in HBM
    host: int = 0
    storage: int = 0
    #: model seconds to load the host and storage keys into HBM before the prefill (HiCache load-back)
    load_seconds: float = 0.0


def _common_len(key: list[int], tokens: Sequence[int], start: int, page_size: int = 1) -> int:
    """Length of the common prefix of key and tokens[start:], in whole pages; slice compares run at C speed."""
    n = min(len(key), len(tokens) - start)
    if page_size > 1:
        return _common_len(key, tokens, start) // page_size * page_size
    if key[:n] == list(tokens[start : start + n]):
        return n
    lo, hi = 0, n  # key[:lo] matches, key[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key[:mid] == list(tokens[start : start + mid]):
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache:
    def __init__(
        self,
        capacity_tokens: int,
        policy: EvictionPolicy = "lru",
        *,
        page_size: int = 1,
        bigram: bool = False,
        events: KvEventRecorder | None = None,
    ) -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"cache capacity must be positive, got {capacity_tokens}")
        if policy not in ("lru", "priority"):
            raise ValueError(f"unknown eviction policy {policy!r}; known: lru, priority")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.capacity = capacity_tokens
        self.policy = policy
        self.page_size = page_size
        self.bigram = bigram
        #: records KV events at the mutation points (None: the worker publishes none)
        self.events = events
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        self.root = Node(key=[], parent=None, lock_ref=1)
        self.size = 0  # tokens held by the tree
        self.locked = 0  # tokens on paths in use by running requests
        self.evicted_total = 0
        if self.events is not None:  # SGLang's reset records it; the scheduler's next step publishes it
            self.events.record_all_cleared()
            self.events.flush()

    def end_step(self) -> None:
        """A scheduler step is over: its KV events go out as one batch."""
        if self.events is not None:
            self.events.flush()

    def keys(self, tokens: Sequence[int]) -> Sequence[int]:
        """The tree's keys for `tokens`: bigrams on an EAGLE tree, cut to whole pages."""
        units = pack_bigrams(tokens) if self.bigram else tokens
        if self.page_size > 1:
            units = units[: len(units) // self.page_size * self.page_size]
        return units

    def _child_key(self, units: Sequence[int], pos: int) -> ChildKey:
        """Children are told apart by their first page (SGLang's `RadixKey.child_key`)."""
        if self.page_size == 1:
            return units[pos]
        return tuple(units[pos : pos + self.page_size])

    # -- lookup -------------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], priority: int = 0) -> MatchResult:
        """Longest cached prefix of `tokens` (in keys); touches (and raises the priority of) the matched path."""
        return self._match(self.keys(tokens), priority)

    def touch_prefix(self, tokens: Sequence[int]) -> None:
        """Bump the recency of `tokens`' cached path, nothing else (SGLang's `RadixCache.touch_prefix`:
        the match walk, no priority, no hit count, no load)."""
        self._match(self.keys(tokens), None)

    def _match(self, tokens: Sequence[int], priority: int | None) -> MatchResult:
        node, pos, now = self.root, 0, next(self._clock)
        ps = self.page_size
        while pos < len(tokens):
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            n = _common_len(child.key, tokens, pos, ps)
            if n < len(child.key):
                if n == 0:
                    break
                child = self._split(child, n)
            child.last_access = now
            if priority is not None:
                child.priority = max(child.priority, priority)
            node, pos = child, pos + n
        return MatchResult(pos, node)

    def _split(self, child: Node, n: int) -> Node:
        """Split `child` so its first n tokens become a new parent node; returns that parent."""
        parent = child.parent
        assert parent is not None
        head = Node(
            key=child.key[:n],
            parent=parent,
            priority=child.priority,
            last_access=child.last_access,
            lock_ref=child.lock_ref,
            on_device=child.on_device,
            on_host=child.on_host,
            on_storage=child.on_storage,
            hit_count=child.hit_count,
        )
        parent.children[self._child_key(head.key, 0)] = head
        child.key = child.key[n:]
        child.parent = head
        head.children[self._child_key(child.key, 0)] = child
        if self.events is not None:  # no event: the blocks are the same, cut between two nodes
            self.events.record_split(child, head)
        return head

    def load_back(self, match: MatchResult, recompute_seconds: float) -> MatchResult:
        """Make a match's host/storage part device-resident before its prefill (HiCache's load-back,
        sim/tiers.py); one tier has nothing to load. `recompute_seconds`: what prefilling the part
        instead would take (a best_effort storage prefetch gives up past it)."""
        del recompute_seconds
        return match

    def take_stall_seconds(self) -> float:
        """Model seconds of cache work that blocked the scheduler since the last call (HiCache's
        write-back copies); charged to the next forward."""
        return 0.0

    # -- insert / evict ---------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], priority: int = 0, *, evict: bool = True) -> int:
        """Insert `tokens`; returns how many new keys were added (then evicts down to capacity, unless
        `evict` is False: `insert_locked` locks the new keys first)."""
        units = self.keys(tokens)
        match = self._match(units, priority)
        added = len(units) - match.length
        if added:
            leaf = Node(
                key=list(units[match.length :]),
                parent=match.node,
                priority=priority,
                last_access=next(self._clock),
            )
            match.node.children[self._child_key(leaf.key, 0)] = leaf
            self.size += added
            if self.events is not None:
                self.events.record_store(leaf)
        if evict and self.size > self.capacity:
            self.evict(self.size - self.capacity)
        return added

    def insert_locked(self, tokens: Sequence[int], priority: int, locked: Node) -> Node:
        """Insert the computed part of a request still being prefilled and move its lock from `locked` to
        the node `tokens` end at (SGLang's `cache_unfinished_req`); returns that node. The new keys are
        locked before the cache evicts down to capacity: SGLang locks the new last node right after the
        insert and evicts only at a later allocation, so a request's computed chunks are never evicted
        while it runs (evicting first let the insert's own eviction take the fresh chunk)."""
        self.insert(tokens, priority, evict=False)
        node = self._match(self.keys(tokens), priority).node
        self.lock(node)
        self.unlock(locked)
        if self.size > self.capacity:
            self.evict(self.size - self.capacity)
        return node

    def evict(self, num_tokens: int) -> int:
        """Evict at least `num_tokens` from unlocked leaves (fewer if the rest is locked)."""
        heap = [(self._rank(n), id(n), n) for n in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key, 0)]
            freed += len(leaf.key)
            if self.events is not None:
                self.events.record_remove(leaf)
            self.size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self._rank(parent), id(parent), parent))
        self.evicted_total += freed
        return freed

    def _rank(self, node: Node) -> tuple[int, ...]:
        if self.policy == "priority":
            return (node.priority, node.last_access)
        return (node.last_access,)

    def _evictable_leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            elif node is not self.root and node.lock_ref == 0:
                out.append(node)
        return out

    # -- locking: running requests protect their prefix from eviction -------------------------------
    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.locked += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked -= len(node.key)
            assert node.parent is not None
            node = node.parent
