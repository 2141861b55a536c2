"""Sizing formulas against hand computation, to the last digit."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.kv import kv_bytes_per_token, plan_kv
from infer_ctl.core.sizing.roofline import plan_roofline
from infer_ctl.core.sizing.spec import break_even_alpha, expected_tokens, speedup, speedup_table
from infer_ctl.core.sizing.transfer import plan_transfer


@pytest.mark.parametrize(
    ("preset", "dtype", "per_token"),
    [
        ("llama-3.1-70b", "bf16", 2 * 2 * 80 * 8 * 128),  # 327,680 B = 320 KiB
        ("llama-2-70b", "fp16", 327_680),  # GQA: 8 KV heads, not 64 (the often-quoted 2.5 MiB ignores GQA)
        ("llama-3.1-8b", "fp8", 2 * 1 * 32 * 8 * 128),  # 65,536
        ("llama-2-7b", "fp16", 2 * 2 * 32 * 32 * 128),  # 524,288: MHA, 512 KiB
        ("mistral-large-2", "bf16", 2 * 2 * 88 * 8 * 128),  # 360,448
    ],
)
def test_kv_bytes_per_token(preset: str, dtype: str, per_token: int) -> None:
    m = presets.model_preset(preset)
    assert kv_bytes_per_token(m.layers, m.kv_heads, m.head_dim, presets.dtype_bytes(dtype)) == per_token


def test_plan_kv_capacity_is_exact_integer_math() -> None:
    plan = plan_kv(layers=80, kv_heads=8, head_dim=128, dtype_bytes=2, context=8192,
                   hbm_bytes=640_000_000_000, weights_bytes=141_107_412_992)
    assert plan.kv_bytes == 327_680 * 8192 == 2_684_354_560
    assert plan.kv_budget_bytes == 640_000_000_000 - 141_107_412_992
    assert plan.max_tokens == (640_000_000_000 - 141_107_412_992) // 327_680 == 1_522_499
    assert plan.max_concurrent == 498_892_587_008 // 2_684_354_560 == 185


def test_plan_kv_weights_larger_than_hbm_gives_zero_capacity() -> None:
    plan = plan_kv(layers=80, kv_heads=8, head_dim=128, dtype_bytes=2, context=1, hbm_bytes=10, weights_bytes=100)
    assert plan.max_concurrent == 0 and plan.kv_budget_bytes == 0


@pytest.mark.parametrize("bad", [dict(layers=0), dict(context=0), dict(mem_fraction=0.0), dict(mem_fraction=1.5)])
def test_plan_kv_rejects_impossible_inputs(bad: dict) -> None:
    args = dict(layers=80, kv_heads=8, head_dim=128, dtype_bytes=2, context=10) | bad
    with pytest.raises(ValueError):
        plan_kv(**args)


def _exact_expected(alpha: Fraction, gamma: int) -> Fraction:
    return sum((alpha**i for i in range(gamma + 1)), Fraction(0))


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.6, 0.8, 0.9, 0.99, 0.9995, 1.0])
@pytest.mark.parametrize("gamma", [0, 1, 3, 4, 7])
def test_expected_tokens_matches_exact_geometric_sum(alpha: float, gamma: int) -> None:
    exact = _exact_expected(Fraction(alpha), gamma)
    assert expected_tokens(alpha, gamma) == pytest.approx(float(exact), rel=1e-12, abs=1e-15)


def test_spec_hand_computed() -> None:
    # E = (1 - 0.8^5) / 0.2 = 0.67232 / 0.2 = 3.3616; S = 3.3616 / (4 * 0.05 + 1) = 2.80133...
    assert expected_tokens(0.8, 4) == pytest.approx(3.3616, abs=1e-12)
    assert speedup(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, abs=1e-12)
    assert expected_tokens(1.0, 4) == 5.0
    assert speedup(1.0, 4, 0.05) == pytest.approx(5 / 1.2)
    assert expected_tokens(0.0, 4) == 1.0
    assert speedup(0.7, 0, 0.3) == 1.0  # no drafting: no speedup, no cost


def test_break_even() -> None:
    be = break_even_alpha(4, 0.05)
    assert be is not None
    assert expected_tokens(be, 4) == pytest.approx(1.2, abs=1e-12)
    assert speedup(be, 4, 0.05) == pytest.approx(1.0, abs=1e-12)
    assert break_even_alpha(4, 0.0) == 0.0
    assert break_even_alpha(4, 1.0) == 1.0  # only perfect acceptance pays for a draft as costly as the target
    assert break_even_alpha(4, 1.5) is None
    assert break_even_alpha(0, 0.5) == 0.0


@pytest.mark.parametrize("args", [(1.1, 4, 0.1), (-0.1, 4, 0.1), (0.5, -1, 0.1), (0.5, 4, -0.1), (math.nan, 4, 0.1)])
def test_spec_rejects_out_of_range(args: tuple) -> None:
    with pytest.raises(ValueError):
        speedup(*args)


def test_speedup_table_shape() -> None:
    grid = speedup_table([0.5, 0.9], [1, 2, 3], 0.1)
    assert len(grid) == 2 and len(grid[0]) == 3
    assert grid[1][2] == pytest.approx(speedup(0.9, 3, 0.1))


def test_transfer_hand_computed() -> None:
    plan = plan_transfer(2_684_354_560, 400.0, 5.0)
    # 400 Gb/s = 50e9 B/s; 2,684,354,560 / 50e9 = 0.0536870912 s; + 5 us
    assert plan.wire_seconds == pytest.approx(0.0536870912, rel=1e-15)
    assert plan.seconds == pytest.approx(0.0536920912, rel=1e-15)
    assert plan_transfer(1_000_000_000, 400.0, 0.0, links=4).seconds == pytest.approx(0.005)
    assert plan_transfer(0, 100.0, 2.0).seconds == pytest.approx(2e-6)
    with pytest.raises(ValueError):
        plan_transfer(1, 0.0)


def test_roofline_hand_computed() -> None:
    m = presets.model_preset("llama-3.1-70b")
    acc = presets.accelerator_preset("h100-sxm")
    plan = plan_roofline(params=m.params, weight_dtype_bytes=2, peak_tflops=acc.fp16_tflops, hbm_tb_s=acc.hbm_tb_s)
    assert plan.machine_balance == pytest.approx(989.4e12 / 3.35e12)
    assert plan.weights_bytes == 141_107_412_992
    assert plan.bound == "bandwidth"
    assert plan.tokens_per_s == pytest.approx(3.35e12 / 141_107_412_992)
    big = plan_roofline(params=m.params, weight_dtype_bytes=2, peak_tflops=989.4, hbm_tb_s=3.35, batch=4096)
    assert big.bound == "compute"


def test_preset_lookup_suggests() -> None:
    with pytest.raises(ValueError, match=r"did you mean 'llama-3\.1-70b'"):
        presets.model_preset("llama-3.1-70")
    assert presets.model_preset("Meta-Llama-3.1-70B").name == "llama-3.1-70b"
