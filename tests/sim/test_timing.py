"""The timing model against core.sizing, and speculative acceptance against S = E[N] / (g*c + 1)."""

from __future__ import annotations

import math
import random

import pytest

from infer_ctl.core.sizing.spec import expected_tokens, speedup
from infer_ctl.sim.timing import draw_accepted, resolve_timing


def test_prefill_rate_and_decode_step_come_from_the_presets() -> None:
    t = resolve_timing("h100-h200-llama-3.1-70b-eagle3", "prefill")
    # 8 x H100 at 989.4 TFLOP/s, MFU 0.5, 2 x 70.55e9 FLOP/token
    assert t.prefill_tokens_per_s == pytest.approx(8 * 989.4e12 * 0.5 / (2 * 70_553_706_496))
    d = resolve_timing("h100-h200-llama-3.1-70b-eagle3", "decode")
    weights = 70_553_706_496 * 2
    assert d.target_step_seconds(1, 0) == pytest.approx(0.002 + weights / (8 * 4.8e12 * 0.8))
    assert d.kv_bytes_per_token == 2 * 2 * 80 * 8 * 128
    # more KV in the batch -> longer steps (bandwidth bound)
    assert d.target_step_seconds(32, 32 * 4096) > d.target_step_seconds(1, 1000)
    assert d.kv_capacity_tokens > 100_000


def test_overrides_and_unknown_preset() -> None:
    t = resolve_timing(speculative=False, step_overhead_s=0.0, cache_capacity_tokens=123)
    assert t.spec_alpha is None and t.kv_capacity_tokens == 123
    assert t.decode_step_seconds(1, 0) == t.target_step_seconds(1, 0)
    with pytest.raises(ValueError, match="unknown simulator preset"):
        resolve_timing("h900")


@pytest.mark.parametrize(("alpha", "gamma"), [(0.8, 3), (0.6, 5), (0.9, 4)])
def test_acceptance_draws_match_expected_tokens(alpha: float, gamma: int) -> None:
    rng = random.Random(42)
    n = 40_000
    tokens = [draw_accepted(rng, alpha, gamma) + 1 for _ in range(n)]
    mean = sum(tokens) / n
    var = sum((x - mean) ** 2 for x in tokens) / (n - 1)
    # within 4 standard errors of Leviathan et al.'s E[N]
    assert abs(mean - expected_tokens(alpha, gamma)) < 4 * math.sqrt(var / n)


def test_measured_speedup_matches_formula() -> None:
    """Decode 20k tokens with and without speculation through the model; time ratio = S."""
    alpha, gamma, c = 0.8, 3, 0.1
    on = resolve_timing(spec_alpha=alpha, spec_gamma=gamma, spec_cost_ratio=c, step_overhead_s=0.0)
    off = resolve_timing(speculative=False, step_overhead_s=0.0)
    rng = random.Random(7)
    target, produced, t_on = 20_000, 0, 0.0
    while produced < target:
        produced += draw_accepted(rng, alpha, gamma) + 1
        t_on += on.decode_step_seconds(1, 0)
    t_off = target * off.decode_step_seconds(1, 0)
    measured = t_off / (t_on * target / produced)
    assert measured == pytest.approx(speedup(alpha, gamma, c), rel=0.03)
    assert on.expected_tokens_per_step == pytest.approx(expected_tokens(alpha, gamma))


def test_transfer_time_uses_nic_bandwidth() -> None:
    t = resolve_timing()
    nbytes = 2048 * t.kv_bytes_per_token
    assert t.transfer_seconds(2048) == pytest.approx(nbytes / (400e9 * 8 / 8) + 10e-6)
