"""core/routing/pair_health.py: how a prefill x decode pair degrades (audit verdict, slow KV samples,
failed transfers), what the picker avoids, the probe and the return (pure: `now` is given)."""

from __future__ import annotations

from infer_ctl.core.routing.pair_health import PairHealth
from infer_ctl.router.fleet.pair_health import kv_numbers
from tests.router.conftest import new_pair_floor

P, D = "http://p:30000", "http://d:30001"


def test_a_failed_pair_test_is_avoided_until_a_later_test_passes() -> None:
    h = PairHealth(new_pair_floor())
    assert not h.avoid(P, D, 0.0)
    h.push(P, D, "fail", "fabric.pingpong: retry counter exceeded", 1.0)
    assert h.avoid(P, D, 1.0) and h.avoid(P, D, 1e9)  # no probe: the router cannot re-run an RDMA test
    assert not h.probe(P, D, 1e9)
    (st,) = h.degraded()
    assert st.reason == "pair_test" and st.as_dict(2.0)["pair_test_reason"].startswith("fabric.pingpong")
    h.push(P, D, "ok", None, 3.0)
    assert not h.avoid(P, D, 3.0) and h.degraded() == []


def test_slow_transfers_degrade_after_a_run_then_a_probe_returns_the_pair() -> None:
    h = PairHealth(new_pair_floor(min_speed_gb_s=10.0, max_latency_ms=50.0, bad_samples=3, probe_after_s=30.0))
    h.sample(P, D, 20.0, 10.0, 0.0)
    h.sample(P, D, 2.0, 10.0, 1.0)
    h.sample(P, D, 20.0, 80.0, 2.0)   # latency over the floor is bad too
    h.sample(P, D, 25.0, 5.0, 3.0)    # a good one breaks the run
    assert not h.avoid(P, D, 3.0)
    for t in (4.0, 5.0, 6.0):
        h.sample(P, D, 1.0, 200.0, t)
    assert h.avoid(P, D, 6.0) and h.degraded()[0].reason == "kv_slow"
    assert h.avoid(P, D, 35.0) and not h.probe(P, D, 35.0)   # inside the wait
    assert not h.avoid(P, D, 36.0) and h.probe(P, D, 36.0)    # one probe once it is over
    assert h.avoid(P, D, 36.5)                                # not a second one while it runs
    h.sample(P, D, 1.5, 150.0, 37.0)                          # the probe was slow: wait again
    assert h.avoid(P, D, 60.0) and not h.avoid(P, D, 67.0)
    assert h.probe(P, D, 67.0)
    h.sample(P, D, 30.0, 4.0, 68.0)                           # recovered
    assert not h.avoid(P, D, 68.0) and h.degraded() == []


def test_failed_transfers_degrade_and_a_successful_probe_returns() -> None:
    h = PairHealth(new_pair_floor(max_failures=2, probe_after_s=10.0))
    h.outcome(P, D, ok=False, transfer_failed=False, now=0.0)  # the worker's own failure: not the pair's
    h.outcome(P, D, ok=False, transfer_failed=True, now=1.0)
    assert not h.avoid(P, D, 1.0)
    h.outcome(P, D, ok=True, transfer_failed=False, now=1.5)   # success resets the run
    h.outcome(P, D, ok=False, transfer_failed=True, now=2.0)
    h.outcome(P, D, ok=False, transfer_failed=True, now=3.0)
    assert h.avoid(P, D, 3.0) and h.degraded()[0].reason == "kv_failed"
    assert h.pairs[(P, D)].transfers_failed == 3
    assert h.probe(P, D, 13.0)
    h.outcome(P, D, ok=True, transfer_failed=False, now=13.5)
    assert not h.avoid(P, D, 13.5)


def test_no_floor_means_samples_never_degrade_and_forget_drops_a_worker() -> None:
    h = PairHealth(new_pair_floor())
    for t in range(10):
        h.sample(P, D, 0.001, 1e6, float(t))
    assert not h.avoid(P, D, 10.0)
    h.push(P, D, "fail", None, 11.0)
    h.forget(D)
    assert h.pairs == {} and not h.avoid(P, D, 12.0)


def test_kv_numbers_from_sglang_loads() -> None:
    # SGLang 0.5.23 /v1/loads: per-rank entries, the disaggregation section, 0.0 before any transfer
    doc = {"loads": [{"dp_rank": 0, "disaggregation": {"kv_transfer_speed_gb_s": 21.5, "kv_transfer_latency_ms": 3.1}},
                     {"dp_rank": 1, "disaggregation": {"kv_transfer_speed_gb_s": 12.0, "kv_transfer_latency_ms": 7.0}}]}
    assert kv_numbers(doc) == (12.0, 7.0)
    assert kv_numbers({"loads": [{"disaggregation": {"kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0}}]}) == (None, None)
    assert kv_numbers({"loads": [{"dp_rank": 0}]}) == (None, None) and kv_numbers("garbage") == (None, None)


def test_a_restarted_worker_s_pairs_start_again_but_keep_the_audit_verdict() -> None:
    # a killed prefill fails every transfer until it is back: those failures were about the process that
    # is gone, so its new process is not avoided for probe_after_s (a full-suite run shunned it 60 s)
    h = PairHealth(new_pair_floor(max_failures=3, probe_after_s=60.0))
    D2 = "http://d2:30001"
    for t in (1.0, 2.0, 3.0):
        h.outcome(P, D, ok=False, transfer_failed=True, now=t)
    h.push(P, D2, "fail", "fabric.pingpong: retry counter exceeded", 3.0)
    assert h.avoid(P, D, 4.0) and h.avoid(P, D2, 4.0)
    h.restarted(P)
    assert not h.avoid(P, D, 4.0)
    assert h.avoid(P, D2, 4.0)  # the fabric test still failed: only a later test returns it
    h.outcome(P, D, ok=False, transfer_failed=True, now=5.0)  # counts start again from zero
    assert not h.avoid(P, D, 5.0)
