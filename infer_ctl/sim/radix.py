"""A token-level radix cache with a capacity, LRU eviction and SGLang's `priority` eviction policy.

Modelled on SGLang's `mem_cache/radix_cache.py`: edges hold token runs, a node's priority is the max
`priority` of the requests that inserted or matched through it and never decreases, only unlocked
leaves are evicted, and the `priority` policy evicts the lowest (priority, last_access) first while
`lru` evicts the least recently used. Access times are a logical counter, so eviction is deterministic.
Tokens enter and leave the tree only in `insert`, `evict` and `reset` (where KV events or a host tier
would attach; see docs/simulator.md "Modules").
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

EvictionPolicy = Literal["lru", "priority"]


@dataclass(eq=False)
class Node:
    key: list[int]
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)
    priority: int = 0
    last_access: int = 0
    lock_ref: int = 0


@dataclass(frozen=True)
class MatchResult:
    length: int
    node: Node


def _common_len(key: list[int], tokens: Sequence[int], start: int) -> int:
    """Length of the common prefix of key and tokens[start:]; slice compares run at C speed."""
    n = min(len(key), len(tokens) - start)
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
    def __init__(self, capacity_tokens: int, policy: EvictionPolicy = "lru") -> None:
        if capacity_tokens <= 0:
            raise ValueError(f"cache capacity must be positive, got {capacity_tokens}")
        if policy not in ("lru", "priority"):
            raise ValueError(f"unknown eviction policy {policy!r}; known: lru, priority")
        self.capacity = capacity_tokens
        self.policy = policy
        self._clock = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        self.root = Node(key=[], parent=None, lock_ref=1)
        self.size = 0  # tokens held by the tree
        self.locked = 0  # tokens on paths in use by running requests
        self.evicted_total = 0

    # -- lookup -------------------------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], priority: int = 0) -> MatchResult:
        """Longest cached prefix of `tokens`; touches (and raises the priority of) the matched path."""
        node, pos, now = self.root, 0, next(self._clock)
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_len(child.key, tokens, pos)
            if n < len(child.key):
                if n == 0:
                    break
                child = self._split(child, n)
            child.last_access = now
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
        )
        parent.children[head.key[0]] = head
        child.key = child.key[n:]
        child.parent = head
        head.children[child.key[0]] = child
        return head

    # -- insert / evict ---------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], priority: int = 0) -> int:
        """Insert `tokens`; returns how many new tokens were added (then evicts down to capacity)."""
        match = self.match_prefix(tokens, priority)
        added = len(tokens) - match.length
        if added:
            leaf = Node(
                key=list(tokens[match.length :]),
                parent=match.node,
                priority=priority,
                last_access=next(self._clock),
            )
            match.node.children[leaf.key[0]] = leaf
            self.size += added
        if self.size > self.capacity:
            self.evict(self.size - self.capacity)
        return added

    def evict(self, num_tokens: int) -> int:
        """Evict at least `num_tokens` from unlocked leaves (fewer if the rest is locked)."""
        heap = [(self._rank(n), id(n), n) for n in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
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
