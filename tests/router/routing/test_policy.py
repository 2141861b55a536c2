"""choose_prefill / choose_decode as pure functions of worker snapshots and the index (table-driven)."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.routing.policy import (
    NoWorkerAvailable,
    WorkerView,
    choose_decode,
    choose_prefill,
)
from infer_ctl.router.config import policy_config, router_settings
from tests.router.conftest import new_prefix_index

A, B, C = "http://a:1", "http://b:1", "http://c:1"
SYS = "system prompt of tenant one. " * 40  # ~1160 chars
CFG = policy_config(router_settings(balance_abs=4, balance_rel=1.5))


def _pick(workers: list[WorkerView], cached: dict[str, str], query: str, **kw) -> tuple[str, str]:
    ix = new_prefix_index(block_chars=64)
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
    ix = new_prefix_index(block_chars=64)
    for u in (A, B):
        ix.insert(ix.hashes(SYS), u, now=0.0)
    rng = random.Random(1)
    for i in range(40):
        workers = [WorkerView(u, inflight=inflight[u]) for u in (A, B, C)]
        q = SYS + f"user question {i} " * 5
        c = choose_prefill(hashes=ix.hashes(q), text_chars=len(q), workers=workers, index=ix, now=1.0,
                           cfg=policy_config(router_settings(balance_abs=100)), rng=rng, replicas=[A, B])
        assert c.reason == "named_prefix"
        counts[c.url] += 1
        inflight[c.url] += 1  # requests pile up: spreading must alternate
    assert counts[C] == 0 and abs(counts[A] - counts[B]) <= 1


def test_named_prefix_spills_when_every_replica_is_overloaded() -> None:
    workers = [WorkerView(A, inflight=20), WorkerView(B, inflight=20), WorkerView(C)]
    url, reason = _pick(workers, {A: SYS, B: SYS}, SYS + "q", replicas=[A, B])
    assert url == C and reason == "balance"


D = "http://d:1"
SHORT_Q = SYS + "q"  # almost all of it is the prefix: queueing behind a few requests is cheap
LONG_Q = SYS + "a long uncached question. " * 80  # ~2,000 uncached chars: recomputing the prefix is cheaper


@pytest.mark.parametrize(
    ("loads", "cached", "query", "expect_url", "expect_reason"),
    [
        # 1. a replica that is not overloaded takes it, the least loaded one
        ({A: 3, B: 1, C: 0, D: 0}, {A: SYS, B: SYS}, SHORT_Q, B, "named_prefix"),
        # 2. every replica overloaded: a non-replica that already holds the prefix grows the set
        ({A: 10, B: 10, C: 1, D: 0}, {A: SYS, B: SYS, C: SYS}, LONG_Q, C, "named_prefix_holder"),
        # 3. every holder overloaded, short uncached part, small excess: queue on the least-loaded replica
        ({A: 10, B: 7, C: 0, D: 0}, {A: SYS, B: SYS}, SHORT_Q, B, "named_prefix_queue"),
        # 4. same loads, long uncached part: queueing costs more than the cold prefix -> spill cold
        ({A: 10, B: 7, C: 0, D: 0}, {A: SYS, B: SYS}, LONG_Q, None, "balance"),
        # 5. excess queue beyond spill_queue_factor x balance_abs: spill even when short
        ({A: 20, B: 20, C: 0, D: 0}, {A: SYS, B: SYS}, SHORT_Q, None, "balance"),
        # 6. the index lost the replicas' entries: no holder is known, the normal policy decides
        ({A: 10, B: 10, C: 0, D: 0}, {}, SHORT_Q, None, "balance"),
    ],
)
def test_named_prefix_when_replicas_are_busy(loads: dict[str, int], cached: dict[str, str], query: str,
                                             expect_url: str | None, expect_reason: str) -> None:
    workers = [WorkerView(u, inflight=n) for u, n in loads.items()]
    url, reason = _pick(workers, cached, query, replicas=[A, B])
    assert reason == expect_reason
    if expect_url is not None:
        assert url == expect_url
    else:  # cold spill: one of the idle non-holders
        assert url in (C, D) and url not in cached


def test_spilled_worker_then_shares_the_hot_prefix_evenly() -> None:
    """A 4-worker fleet, K=2 replicas, requests piling up: after the first cold spill, the spilled
    worker is a holder, and the replicas never get more than balance_abs above it."""
    ix = new_prefix_index(block_chars=64)
    for u in (A, B):
        ix.insert(ix.hashes(SYS), u, now=0.0)
    inflight = dict.fromkeys((A, B, C, D), 0)
    rng = random.Random(3)
    reasons = []
    for i in range(40):
        q = SYS + f"user question {i} " * 60
        c = choose_prefill(hashes=ix.hashes(q), text_chars=len(q), workers=[WorkerView(u, inflight=n) for u, n in inflight.items()],
                           index=ix, now=1.0, cfg=CFG, rng=rng, replicas=[A, B])
        ix.insert(ix.hashes(q), c.url, now=1.0)
        inflight[c.url] += 1
        reasons.append(c.reason)
        assert max(inflight.values()) - min(inflight.values()) <= CFG.balance_abs + 1
    cold = [r for r in reasons if r not in ("named_prefix", "named_prefix_holder", "named_prefix_queue")]
    assert len(cold) <= 2 and "named_prefix_holder" in reasons


@pytest.mark.parametrize("policy", ["round_robin", "random", "power_of_two"])
def test_simple_policies_only_pick_available_workers(policy: str) -> None:
    workers = [WorkerView(A), WorkerView(B, available=False), WorkerView(C)]
    seen = {_pick(workers, {}, "q", cfg=policy_config(router_settings(policy=policy)), seq=i)[0] for i in range(20)}
    assert seen <= {A, C} and seen


def test_round_robin_cycles() -> None:
    workers = [WorkerView(A), WorkerView(B)]
    picks = [_pick(workers, {}, "q", cfg=policy_config(router_settings(policy="round_robin")), seq=i)[0] for i in range(4)]
    assert picks == [A, B, A, B]


@pytest.mark.parametrize(
    ("loads", "allowed"),
    [({A: 3, B: 1, C: 2}, {B}), ({A: 0, B: 0, C: 5}, {A, B})],
)
def test_decode_is_least_loaded(loads: dict[str, int], allowed: set[str]) -> None:
    workers = [WorkerView(u, inflight=n) for u, n in loads.items()]
    picks = {choose_decode(workers, random.Random(s)).url for s in range(20)}
    assert picks == allowed
