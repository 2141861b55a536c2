"""core/spec/controller.py: when a pool is changed, to what, and that it never flaps (hysteresis in alpha
and time, one pool change per cool-down, no relaunch to the setting it already runs)."""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Any

from infer_ctl.core.spec.controller import Controller, ControlSettings, PoolObservation
from infer_ctl.core.spec.judge import SpecLimits
from infer_ctl.core.spec.pools import Pool, apply_command, pool_change_yaml, with_pool_setting
from infer_ctl.profile.load import validate_profile_data

LIMITS = SpecLimits(alert_threshold=0.5, cost_ratio=0.1, min_steps=1, max_steps=8)


def _pools() -> list[Pool]:
    return [Pool("a", ("dc-01",), "decode", LIMITS, None, 3, None), Pool("b", ("dc-02",), "decode", LIMITS, None, 3, None)]


def _ctl(**kw: Any) -> Controller:
    settings = ControlSettings(**{"sustain_s": 60, "cooldown_s": 600, "min_requests": 50, "hysteresis": 0.05, **kw})
    return Controller(_pools(), settings)


def _obs(pool: str, alpha: float, steps: int = 3, requests: int = 200, adaptive: bool = False) -> PoolObservation:
    return PoolObservation(pool, alpha, requests, steps, adaptive)


def test_a_sustained_drop_changes_the_pool_to_the_recommended_gamma() -> None:
    ctl = _ctl()
    assert ctl.step([_obs("a", 0.4), _obs("b", 0.8)], 0.0) == []  # the drop starts the timer
    assert ctl.step([_obs("a", 0.4)], 59.0) == []
    [change] = ctl.step([_obs("a", 0.4)], 60.0)
    assert (change.pool, change.action, change.num_steps, change.from_steps) == ("a", "relaunch", 2, 3)
    assert change.speedup_after > change.speedup_before
    assert "below the alert threshold 0.5" in change.reason


def test_not_enough_requests_or_a_recovery_resets_nothing_until_judged() -> None:
    ctl = _ctl()
    ctl.step([_obs("a", 0.4)], 0.0)
    assert ctl.step([_obs("a", 0.4, requests=10)], 100.0) == []  # a restarted pool: not judged yet
    assert ctl.step([_obs("a", 0.52)], 110.0) == []  # inside the band: the timer stops
    assert ctl.step([_obs("a", 0.4)], 120.0) == []
    assert ctl.step([_obs("a", 0.4)], 179.0) == [] and ctl.step([_obs("a", 0.4)], 180.0) != []


def test_one_pool_change_per_cooldown_across_pools_worst_first() -> None:
    ctl = _ctl()
    ctl.step([_obs("a", 0.4), _obs("b", 0.25)], 0.0)
    [first] = ctl.step([_obs("a", 0.4), _obs("b", 0.25)], 60.0)
    assert first.pool == "b"  # the bigger expected gain
    ctl.applied(first, 60.0)
    assert ctl.step([_obs("a", 0.4), _obs("b", 0.25, steps=1)], 120.0) == []  # cooling down
    assert ctl.step([_obs("a", 0.4), _obs("b", 0.25, steps=1)], 659.0) == []
    [second] = ctl.step([_obs("a", 0.4), _obs("b", 0.25, steps=1)], 660.0)
    assert second.pool == "a"


def test_never_flaps_around_the_threshold() -> None:
    """alpha noisy around 0.5 for hours: at most one change per cool-down, and never back and forth
    faster than sustain + cool-down."""
    rng = random.Random(7)
    ctl = _ctl(sustain_s=60, cooldown_s=600)
    steps = 3
    changes = []
    for t in range(0, 6 * 3600, 15):
        alpha = 0.5 + rng.uniform(-0.06, 0.06)
        for c in ctl.step([_obs("a", alpha, steps=steps)], float(t)):
            ctl.applied(c, float(t))
            changes.append((t, c.action, c.num_steps))
            steps = c.num_steps
    times = [t for t, _, _ in changes]
    assert all(b - a >= 600 for a, b in pairwise(times))
    assert len(changes) <= 6 * 3600 // 600


def test_restore_after_a_sustained_recovery_above_the_band() -> None:
    ctl = _ctl()
    ctl.step([_obs("a", 0.4)], 0.0)
    [c] = ctl.step([_obs("a", 0.4)], 60.0)
    ctl.applied(c, 60.0)
    assert ctl.step([_obs("a", 0.53, steps=2)], 700.0) == []  # above 0.5 but inside the band
    ctl.step([_obs("a", 0.8, steps=2)], 700.0)
    [back] = ctl.step([_obs("a", 0.8, steps=2)], 760.0)
    assert (back.action, back.num_steps) == ("restore", 3)
    ctl.applied(back, 760.0)
    assert ctl.step([_obs("a", 0.8, steps=3)], 2000.0) == []  # restored: nothing more to do


def test_already_at_the_recommendation_is_left_alone() -> None:
    ctl = _ctl()
    ctl.step([_obs("a", 0.4, steps=2)], 0.0)
    assert ctl.step([_obs("a", 0.4, steps=2)], 100.0) == []
    # a gain below min_gain is not worth a relaunch: alpha 0.45 at 3 steps vs 2 steps
    ctl2 = _ctl(min_gain=1.10)
    ctl2.step([_obs("a", 0.45)], 0.0)
    assert ctl2.step([_obs("a", 0.45)], 100.0) == []


def test_adaptive_mode_with_the_formula_candidates() -> None:
    ctl = _ctl(adaptive=True, algorithm="EAGLE3", eagle_topk=1)
    ctl.step([_obs("a", 0.3)], 0.0)
    [c] = ctl.step([_obs("a", 0.3)], 60.0)
    assert c.num_steps == 1 and c.adaptive_steps == (0, 1)
    ctl2 = _ctl(adaptive=True, algorithm="EAGLE3", eagle_topk=4)  # SGLang runs adaptive at topk 1 only
    ctl2.step([_obs("a", 0.3)], 0.0)
    [c2] = ctl2.step([_obs("a", 0.3)], 60.0)
    assert c2.adaptive_steps is None


def test_the_advice_and_the_derived_profile() -> None:
    prof = validate_profile_data({
        "name": "p", "nodes": [{"name": "pf-01", "host": "10.0.0.1", "roles": ["prefill"]},
                               {"name": "dc-01", "host": "10.0.0.2", "roles": ["decode"]},
                               {"name": "dc-02", "host": "10.0.0.3", "roles": ["decode"]}],
        "models": {"target": {"path": "/m"}, "draft": {"path": "/d", "algorithm": "EAGLE3", "num_steps": 3,
                                                      "eagle_topk": 1, "num_draft_tokens": 4}}})
    from infer_ctl.core.spec.pools import pools

    pool = next(p for p in pools(prof) if p.name == "dc-02")
    text = pool_change_yaml(pool, 1, None)
    assert "speculative:\n  pools:\n    - name: dc-02\n      nodes: [dc-02]\n      num_steps: 1\n" in text
    assert apply_command("prod.yaml", pool) == "inferctl launch -p prod.yaml --rolling --role decode --nodes dc-02"
    derived = with_pool_setting(prof, pool, 1, (0, 1))
    assert derived.speculative.pools[-1].num_steps == 1 and prof.speculative.pools == []
    again = validate_profile_data(derived.model_dump())  # what was derived is a valid profile
    assert again.speculative.pools[0].adaptive_steps == [0, 1]
