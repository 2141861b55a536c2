"""Pure parts of the bench: workloads (seeded, shaped as documented) and the statistics."""

from __future__ import annotations

import pytest

from infer_ctl.bench.client import _jobs
from infer_ctl.bench.stats import RequestResult, Slo, hit_rate_over_time, percentile, summarize
from infer_ctl.bench.workloads import WorkloadSpec, build


def test_percentile_interpolates_like_numpy() -> None:
    xs = [1.0, 2.0, 3.0, 4.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile([], 50) is None


def _r(i: int, ttft: float, e2e: float, tokens: int, cached: int = 0, ok: bool = True) -> RequestResult:
    return RequestResult(index=i, tenant="t", ok=ok, start=float(i), ttft=ttft, e2e=e2e, itls=[0.01],
                         prompt_tokens=100, completion_tokens=tokens, cached_tokens=cached)


def test_summary_goodput_hit_rate_and_time_scale() -> None:
    results = [
        _r(0, 0.5, 1.5, 11, cached=50),  # TPOT 0.1: meets the SLO exactly
        _r(1, 3.0, 4.0, 11),  # TTFT over the SLO
        _r(2, 0.1, 5.1, 11, cached=100),  # TPOT 0.5: over
        _r(3, 0.0, 0.0, 0, ok=False),
    ]
    results[3].error = "HTTP 500: boom"
    s = summarize(results, duration_s=2.0, slo=Slo(ttft_s=2.0, tpot_s=0.1), time_scale=0.5)
    assert s["completed"] == 3 and s["failed"] == 1
    assert s["model_duration_s"] == 4.0
    assert s["goodput"] == pytest.approx(1 / 4.0)
    assert s["request_throughput"] == pytest.approx(3 / 4.0)
    assert s["cache_hit_rate"] == pytest.approx(150 / 300)
    assert s["errors"] == {"HTTP 500: boom": 1}
    assert s["ttft_s"]["p50"] == 0.5


def test_hit_rate_over_time_bins() -> None:
    series = hit_rate_over_time([_r(0, 0.1, 1, 2, 0), _r(10, 0.1, 1, 2, 100)], bins=2)
    assert series[0][1] == 0.0 and series[-1][1] == 1.0


def test_shared_prefix_workload_is_seeded_and_zipf_skewed() -> None:
    a = build(WorkloadSpec("shared-prefix", requests=300, seed=1, num_prefixes=8, prefix_tokens=64))
    b = build(WorkloadSpec("shared-prefix", requests=300, seed=1, num_prefixes=8, prefix_tokens=64))
    assert a == b
    counts = {t: sum(r.tenant == t for r in a) for t in {r.tenant for r in a}}
    assert counts["tenant-00"] > counts.get("tenant-07", 0) * 2, "rank 1 is far more popular than rank 8"
    same = [r for r in a if r.tenant == "tenant-00"]
    assert same[0].text.split("\n\n")[0] == same[1].text.split("\n\n")[0]
    assert len(same[0].text.split()) > 64


def test_multi_turn_sessions_grow_and_run_in_order() -> None:
    reqs = build(WorkloadSpec("multi-turn", requests=8, turns=4, seed=2))
    s0 = [r for r in reqs if r.session == 0]
    assert [r.turn for r in s0] == [0, 1, 2, 3]
    assert all(s0[i + 1].text.startswith(s0[i].text) for i in range(3)), "each turn resends the history"
    assert [len(j) for j in _jobs(reqs)] == [4, 4]


def test_random_workload_and_errors() -> None:
    reqs = build(WorkloadSpec("random", requests=5, seed=3, random_min_tokens=5, random_max_tokens=10))
    assert len({r.text for r in reqs}) == 5
    with pytest.raises(ValueError, match="unknown workload"):
        build(WorkloadSpec("bursty"))
    with pytest.raises(ValueError, match="at least 1"):
        build(WorkloadSpec(requests=0))
