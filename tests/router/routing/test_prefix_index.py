"""PrefixIndex: block radix matching, TTL expiry, LRU bounds, per-worker drop (pure, no sockets)."""

from __future__ import annotations

import pytest

from infer_ctl.core.routing.index import PrefixIndex, block_hashes
from tests.router.conftest import new_prefix_index

A, B = "http://a:1", "http://b:1"
SYS = "S" * 640  # 10 blocks of 64


def idx(**kw) -> PrefixIndex:
    return new_prefix_index(block_chars=64, **kw)


def test_block_hashes_are_prefix_chains() -> None:
    h1 = block_hashes(SYS + "x" * 64, 64)
    h2 = block_hashes(SYS + "y" * 64, 64)
    assert h1[:10] == h2[:10] and h1[10] != h2[10]
    assert block_hashes("short", 64) == []  # the partial block is never indexed


@pytest.mark.parametrize(
    ("inserted", "query", "expected"),
    [
        ({A: SYS}, SYS + "tail", {A: 640, B: 0}),
        ({A: SYS, B: SYS[:320]}, SYS + "tail", {A: 640, B: 320}),
        ({A: SYS + "q1" * 64}, SYS + "q2" * 64, {A: 640, B: 0}),
        ({A: "T" * 640}, SYS, {A: 0, B: 0}),
        ({}, SYS, {A: 0, B: 0}),
    ],
    ids=["full", "partial-other", "diverging-suffix", "no-overlap", "empty"],
)
def test_match_table(inserted: dict[str, str], query: str, expected: dict[str, int]) -> None:
    ix = idx()
    for worker, text in inserted.items():
        ix.insert(ix.hashes(text), worker, now=0.0)
    assert ix.match(ix.hashes(query), [A, B], now=1.0) == expected


def test_idle_entries_expire_after_ttl_and_touch_renews() -> None:
    ix = idx(ttl_s=10)
    ix.insert(ix.hashes(SYS), A, now=0.0)
    ix.insert(ix.hashes(SYS[:128]), A, now=8.0)  # touches the first two blocks only
    assert ix.match(ix.hashes(SYS), [A], now=11.0) == {A: 128}  # stale deeper blocks do not match
    assert ix.expire(now=11.0) == 8
    assert len(ix) == 2
    assert ix.expire(now=19.0) == 2 and len(ix) == 0


def test_global_cap_evicts_least_recently_used_leaves_first() -> None:
    ix = idx(max_blocks=12)
    ix.insert(ix.hashes(SYS), A, now=0.0)  # 10 blocks
    ix.insert(ix.hashes("Q" * 320), B, now=1.0)  # 5 more -> 15 > 12: evict 3 oldest (A's leaves)
    assert len(ix) == 12
    assert ix.match(ix.hashes(SYS), [A], now=2.0) == {A: 7 * 64}
    assert ix.evicted == 3


def test_per_worker_capacity_mirrors_worker_lru() -> None:
    ix = idx()
    ix.set_capacity(A, 10)
    ix.insert(ix.hashes(SYS), A, now=0.0)
    ix.insert(ix.hashes("R" * 320), A, now=1.0)
    # 15 blocks into 10: the old prompt's deepest 5 blocks go first; its root stays (prefix-closed)
    assert ix.match(ix.hashes(SYS), [A], now=2.0) == {A: 5 * 64}
    assert ix.match(ix.hashes("R" * 320), [A], now=2.0) == {A: 320}
    assert ix.footprint(A) == 640


def test_a_prompt_longer_than_the_workers_capacity_inserts_only_what_fits() -> None:
    ix = idx(max_blocks=100)
    assert ix.capacity(A) is None
    ix.set_capacity(A, 10)
    assert ix.capacity(A) == 10
    ix.insert(ix.hashes("R" * 640), B, now=0.0)
    long = ix.hashes("L" * 64 * 50)
    ix.insert(long, A, now=1.0)
    # its first 10 blocks, and nothing beyond them was inserted to be evicted again
    assert ix.match(long, [A], now=2.0) == {A: 640} and ix.footprint(A) == 640 and ix.evicted == 0
    longer = ix.hashes("M" * 64 * 150)
    ix.insert(longer, B, now=3.0)  # no capacity known: the global cap bounds it
    assert ix.match(longer, [B], now=4.0) == {B: 100 * 64} and len(ix) == 100


def test_drop_worker_forgets_only_that_worker() -> None:
    ix = idx()
    ix.insert(ix.hashes(SYS), A, now=0.0)
    ix.insert(ix.hashes(SYS), B, now=0.0)
    assert ix.drop_worker(A) == 10
    assert ix.match(ix.hashes(SYS), [A, B], now=1.0) == {A: 0, B: 640}
    assert len(ix) == 10


def test_rejects_nonsense_block_size() -> None:
    with pytest.raises(ValueError):
        PrefixIndex(block_chars=0, ttl_s=1.0, max_blocks=1)
