"""core/spec: the judgement from the speedup formula (recommended gamma, break-even, statuses and their
findings) and the adaptive-mode candidates, against hand-computed values of S = E[N] / (g*c + 1)."""

from __future__ import annotations

import pytest

from infer_ctl.core.sizing.spec import break_even_alpha, speedup
from infer_ctl.core.spec.adaptive import (
    adaptive_applies,
    adaptive_config,
    formula_candidates,
    launch_candidate,
)
from infer_ctl.core.spec.judge import SpecLimits, acceptance_finding, assess, recommend_steps


def test_recommended_gamma_is_the_argmax_of_s() -> None:
    # alpha 0.4, c 0.1: S(1) = 1.4/1.1 = 1.2727, S(2) = 1.56/1.2 = 1.3, S(3) = 1.624/1.3 = 1.2492
    assert recommend_steps(0.4, 0.1, range(1, 9)) == (2, pytest.approx(1.3))
    # alpha 0.8 prefers long lookahead: S(5) = (1-0.8^6)/0.2/1.5 = 3.6893/1.5 = 2.4595 is the maximum
    g, s = recommend_steps(0.8, 0.1, range(1, 9))
    assert g == max(range(1, 9), key=lambda k: speedup(0.8, k, 0.1)) and s == pytest.approx(speedup(0.8, g, 0.1))
    assert recommend_steps(0.8, 0.1, range(1, 4))[0] == 3  # the operator's max_steps caps it


def test_assess_statuses() -> None:
    limits = SpecLimits(alert_threshold=0.5, cost_ratio=0.1, min_steps=1, max_steps=8)
    ok = assess(0.8, 3, limits)
    assert ok.status == "ok" and ok.speedup == pytest.approx(2.9520 / 1.3, abs=1e-4)
    warn = assess(0.4, 3, limits)
    assert warn.status == "warn" and warn.recommended_steps == 2
    assert warn.break_even_alpha == pytest.approx(break_even_alpha(3, 0.1))
    # break-even of 3 steps at c 0.1: E[N] = 1.3, alpha ~0.2308; below it S < 1
    fail = assess(0.2, 3, limits)
    assert fail.status == "fail" and fail.speedup < 1 and fail.recommended_steps == 1
    assert fail.floor_alpha == pytest.approx(0.1)  # at 1 step E[N] = 1 + alpha >= 1 + c
    assert assess(0.01, 1, limits).near_zero


def test_findings_say_what_to_do() -> None:
    limits = SpecLimits(alert_threshold=0.5, cost_ratio=0.1)
    w = acceptance_finding("dc-02", "dc-02-decode", assess(0.4, 3, limits), requests=200)
    assert w.status.value == "warn" and "recommended gamma 2" in w.message and "below the alert threshold 0.5" in w.message
    f = acceptance_finding("dc-02", "dc-02-decode", assess(0.2, 3, limits), requests=200)
    assert f.status.value == "fail" and "slower than none" in f.message
    assert f.remedy is not None and "disable speculation or change the draft" in f.remedy
    z = acceptance_finding("dc-02", "dc-02-decode", assess(0.01, 3, limits), requests=200,
                           tokenizer_hint="fail: special tokens differ (2026-01-01T00:00:00Z)")
    assert z.status.value == "fail" and "check tokenizer" in (z.remedy or "")
    assert "last tokenizer check: fail: special tokens differ" in z.message
    ok = acceptance_finding("dc-01", "dc-01-decode", assess(0.85, 3, limits), requests=200, pair="t / d")
    assert ok.status.value == "ok" and ok.details["pair"] == "t / d"


def test_bad_limits_are_refused() -> None:
    for kw in ({"alert_threshold": 1.0}, {"alert_threshold": 0.0}, {"min_steps": 4, "max_steps": 2},
               {"cost_ratio": -0.1}):
        with pytest.raises(ValueError):
            SpecLimits(**kw)  # type: ignore[arg-type]


def test_formula_candidates_are_the_argmaxes_plus_no_drafting() -> None:
    cands = formula_candidates(0.1, 1, 8)
    assert cands[0] == 0 and cands == sorted(set(cands))
    for a in (0.2, 0.4, 0.6, 0.8, 0.95):
        assert recommend_steps(a, 0.1, range(1, 9))[0] in cands
    # a costlier draft never wants long lookahead
    assert max(formula_candidates(0.5, 1, 8)) < max(cands)
    assert formula_candidates(0.1, 2, 3, allow_zero=False) == [2, 3]
    assert launch_candidate([0, 1, 3, 6], 3) == 3
    assert launch_candidate([0, 1, 3, 6], 4) == 3 and launch_candidate([0, 2, 4], 3) == 4
    assert adaptive_config([3, 1, 1]) == {"1": {"candidate_steps": [1, 3]}}
    assert adaptive_applies("EAGLE3", 1) and adaptive_applies("eagle", None)
    assert not adaptive_applies("EAGLE3", 4) and not adaptive_applies("NGRAM", 1)
