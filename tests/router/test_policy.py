"""choose_prefill / choose_decode as pure functions of worker snapshots and the index (table-driven)."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.policy import (
    NoWorkerAvailable,
    PolicyConfig,
    WorkerView,
    choose_decode,
    choose_prefill,
)

A, B, C = "http://a:1", "http://b:1", "http://c:1"
SYS = "system prompt of tenant one. " * 40  # ~1160 chars
CFG = PolicyConfig(balance_abs=4, balance_rel=1.5)


def _pick(workers: list[WorkerView], cached: dict[str, str], query: str, **kw) -> tuple[str, str]:
    ix = PrefixIndex(block_chars=64)
    for url, text in cached.items():
        ix.insert(ix.hashes(text), url, now=0.0)
    c = choose_prefill(hashes=ix.hashes(query), text_chars=len(query), workers=workers, index=ix, now=1.0,
                       cfg=kw.pop("cfg", CFG), rng=random.Random(7), **kw)
    return c.url, c.reason


@pytest.mark.parametrize(
    ("loads", "cached", "expect_url", "expect_reason"),
    [
        ({A: 0, B: 0}, {B: SYS}, B, "cache_hit"),  # affinity wins at equal load
        ({A: 0, B: 3}, {B: SYS}, B, "cache_hit"),  # small imbalance: still affinity
        ({A: 0, B: 10}, {B: SYS}, A, "balance"),  # overloaded holder: guard moves the request
        ({A: 0, B: 10, C: 1}, {B: SYS, C: SYS}, C, "cache_hit"),  # second holder not overloaded: keep affinity
        ({A: 2, B: 0}, {}, B, "fallback"),  # nothing cached: less loaded of two
        ({A: 0, B: 0}, {B: SYS[:128]}, None, "fallback"),  # match below threshold is not affinity
    ],
    ids=["affinity", "affinity-small-imbalance", "load-guard", "next-holder", "p2c-by-load", "below-threshold"],
)
def test_cache_aware_table(loads: dict[str, int], cached: dict[str, str], expect_url: str | None, expect_reason: str) -> None:
    workers = [WorkerView(u, inflight=n) for u, n in loads.items()]
    url, reason = _pick(workers, cached, SYS + "question?")
    assert reason == expect_reason
    if expect_url:
        assert url == expect_url


def test_fallback_prefers_the_emptier_cache_at_equal_load() -> None:
    workers = [WorkerView(A), WorkerView(B)]
    url, reason = _pick(workers, {A: "X" * 6400}, "brand new tenant " * 20)
    assert (url, reason) == (B, "fallback")


def test_worker_reported_queue_counts_as_load() -> None:
    workers = [WorkerView(A, inflight=0, queued=20), WorkerView(B)]
    assert _pick(workers, {A: SYS}, SYS + "q")[0] == B


def test_unavailable_workers_are_never_chosen() -> None:
    workers = [WorkerView(A, available=False), WorkerView(B)]
    assert _pick(workers, {A: SYS}, SYS + "q")[0] == B
    with pytest.raises(NoWorkerAvailable):
        _pick([WorkerView(A, available=False)], {}, "x")


def test_named_prefix_traffic_spreads_over_its_replicas() -> None:
    counts = {A: 0, B: 0, C: 0}
    inflight = {A: 0, B: 0, C: 0}
    ix = PrefixIndex(block_chars=64)
    for u in (A, B):
        ix.insert(ix.hashes(SYS), u, now=0.0)
    rng = random.Random(1)
    for i in range(40):
        workers = [WorkerView(u, inflight=inflight[u]) for u in (A, B, C)]
        q = SYS + f"user question {i} " * 5
        c = choose_prefill(hashes=ix.hashes(q), text_chars=len(q), workers=workers, index=ix, now=1.0,
                           cfg=PolicyConfig(balance_abs=100), rng=rng, replicas=[A, B])
        assert c.reason == "named_prefix"
        counts[c.url] += 1
        inflight[c.url] += 1  # requests pile up: spreading must alternate
    assert counts[C] == 0 and abs(counts[A] - counts[B]) <= 1


def test_named_prefix_spills_when_every_replica_is_overloaded() -> None:
    workers = [WorkerView(A, inflight=20), WorkerView(B, inflight=20), WorkerView(C)]
    url, reason = _pick(workers, {A: SYS, B: SYS}, SYS + "q", replicas=[A, B])
    assert url == C and reason == "balance"


@pytest.mark.parametrize("policy", ["round_robin", "random", "power_of_two"])
def test_simple_policies_only_pick_available_workers(policy: str) -> None:
    workers = [WorkerView(A), WorkerView(B, available=False), WorkerView(C)]
    seen = {_pick(workers, {}, "q", cfg=PolicyConfig(policy=policy), seq=i)[0] for i in range(20)}
    assert seen <= {A, C} and seen


def test_round_robin_cycles() -> None:
    workers = [WorkerView(A), WorkerView(B)]
    picks = [_pick(workers, {}, "q", cfg=PolicyConfig(policy="round_robin"), seq=i)[0] for i in range(4)]
    assert picks == [A, B, A, B]


@pytest.mark.parametrize(
    ("loads", "allowed"),
    [({A: 3, B: 1, C: 2}, {B}), ({A: 0, B: 0, C: 5}, {A, B})],
)
def test_decode_is_least_loaded(loads: dict[str, int], allowed: set[str]) -> None:
    workers = [WorkerView(u, inflight=n) for u, n in loads.items()]
    picks = {choose_decode(workers, random.Random(s)).url for s in range(20)}
    assert picks == allowed
