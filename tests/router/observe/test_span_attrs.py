"""The request span's inferctl.* attributes as pure functions (router/observe/span_attrs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infer_ctl.core.routing.spec_fields import decode_meta_info
from infer_ctl.core.sizing.spec import speedup
from infer_ctl.router.observe.span_attrs import (
    decode_attributes,
    itl_attributes,
    kv_attributes,
    spec_attributes,
)


def _meta(verify: int, correct: int, completion: int, drafts: int = 3) -> dict[str, object]:
    return {"spec_verify_ct": verify, "spec_num_correct_drafts": correct, "spec_num_proposed_drafts": verify * drafts,
            "spec_accept_rate": correct / (verify * drafts), "spec_accept_length": completion / verify}


def test_spec_totals_over_a_batch_and_the_speedup_model() -> None:
    fields = [decode_meta_info(_meta(10, 12, 22)), decode_meta_info(_meta(5, 3, 8))]
    a = spec_attributes([f for f in fields if f is not None], 0.1)
    assert (a["inferctl.spec.verify_steps"], a["inferctl.spec.drafted_tokens"], a["inferctl.spec.accepted_tokens"]) == (15, 45, 15)
    assert a["inferctl.spec.gamma"] == 3 and a["inferctl.spec.accept_length"] == pytest.approx(30 / 15)
    assert a["inferctl.spec.accept_rate"] == pytest.approx(15 / 45)
    assert a["inferctl.spec.speedup"] == pytest.approx(2.0 / 1.3, abs=1e-4)
    # the model's speedup at alpha 1 (every draft accepted: E[N] = gamma + 1) is the formula's
    (f,) = [decode_meta_info(_meta(4, 12, 16))]
    assert f is not None
    assert spec_attributes([f], 0.1)["inferctl.spec.speedup"] == pytest.approx(speedup(1.0, 3, 0.1), abs=1e-4)
    assert spec_attributes([], 0.1) == {}


def test_itl_percentiles_are_observed_gaps() -> None:
    times = [0.0, 0.01, 0.02, 0.03, 0.53]  # three 10 ms gaps and one stall of 500 ms
    a = itl_attributes(times)
    assert a["inferctl.itl.p50_s"] == pytest.approx(0.01) and a["inferctl.itl.p99_s"] == pytest.approx(0.5)
    assert a["inferctl.itl.chunks"] == 4 and itl_attributes([0.0, 0.1]) == {}  # one gap says nothing of a spread


def test_kv_and_decode_facts_name_what_is_known_only() -> None:
    pair = SimpleNamespace(sample_at=9.0, latency_ms=2.0, speed_gb_s=50.0)
    a = kv_attributes(pair, now=10.0)
    assert a == {"inferctl.kv.sample_age_s": 1.0, "inferctl.kv.transfer_ms": 2.0, "inferctl.kv.transfer_gb_s": 50.0,
                 "inferctl.kv.transfer_bytes": 100_000_000}
    assert kv_attributes(SimpleNamespace(sample_at=None, latency_ms=None, speed_gb_s=None), 1.0) == {}
    d = SimpleNamespace(draft="eagle3", algorithm="EAGLE3", num_steps=None)
    assert decode_attributes(d, ("nixl", None)) == {"inferctl.spec.draft_model": "eagle3",
                                                    "inferctl.spec.algorithm": "EAGLE3",
                                                    "inferctl.kv.transfer_backend": "nixl"}
