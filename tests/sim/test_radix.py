"""The token-level radix cache: prefix reuse, splitting, capacity, LRU and priority eviction, locking."""

from __future__ import annotations

import pytest

from infer_ctl.sim.radix import RadixCache


def test_match_counts_shared_token_prefix_and_splits_edges() -> None:
    c = RadixCache(1000)
    assert c.insert([1, 2, 3, 4, 5]) == 5
    assert c.match_prefix([1, 2, 3, 9]).length == 3
    assert c.insert([1, 2, 3, 9, 9]) == 2  # only the new suffix is stored
    assert c.size == 7
    assert c.match_prefix([1, 2, 3, 4, 5, 6]).length == 5
    assert c.match_prefix([7]).length == 0


def test_long_prefixes_match_exactly() -> None:
    c = RadixCache(100_000)
    base = list(range(2000))
    c.insert(base)
    probe = [*base[:1234], -1, *base[1235:]]
    assert c.match_prefix(probe).length == 1234


def test_capacity_pressure_evicts_least_recently_used() -> None:
    c = RadixCache(10, "lru")
    c.insert([1, 1, 1, 1])  # A
    c.insert([2, 2, 2, 2])  # B
    c.match_prefix([1, 1, 1, 1])  # touch A: B is now least recently used
    c.insert([3, 3, 3, 3])  # C: 12 > 10, evict B
    assert c.size == 8 and c.evicted_total == 4
    assert c.match_prefix([1, 1, 1, 1]).length == 4
    assert c.match_prefix([2, 2, 2, 2]).length == 0


def test_priority_policy_keeps_high_priority_prefix_under_flood() -> None:
    c = RadixCache(20, "priority")
    system = [9] * 8
    c.insert(system, priority=10)  # the pinned-ish system prompt
    for i in range(10):  # a flood of low-priority, more recent prompts
        c.insert([100 + i] * 4, priority=0)
    assert c.match_prefix(system).length == 8, "priority eviction protects the high-priority node"
    lru = RadixCache(20, "lru")
    lru.insert(system)
    for i in range(10):
        lru.insert([100 + i] * 4)
    assert lru.match_prefix(system).length == 0, "plain LRU loses it"


def test_node_priority_is_the_max_of_requests_and_never_decreases() -> None:
    c = RadixCache(100, "priority")
    c.insert([1, 2, 3], priority=5)
    c.insert([1, 2, 3, 4], priority=1)
    node = c.match_prefix([1, 2, 3]).node
    assert node.priority == 5


def test_locked_prefix_is_not_evicted() -> None:
    c = RadixCache(8)
    c.insert([1] * 6)
    m = c.match_prefix([1] * 6)
    c.lock(m.node)
    c.insert([2] * 6)  # over capacity, but the locked path must survive
    assert c.match_prefix([1] * 6).length == 6
    c.unlock(m.node)
    assert c.locked == 0
    c.insert([3] * 6)
    assert c.size <= 8


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="positive"):
        RadixCache(0)
    with pytest.raises(ValueError, match="eviction policy"):
        RadixCache(10, "lfu")  # type: ignore[arg-type]
