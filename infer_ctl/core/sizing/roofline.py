"""Roofline for decoding: machine balance and the bandwidth bound on tokens/s.

A decode step of a dense model reads every weight once (plus the batch's KV cache) and does about
2 x params FLOPs per token. Machine balance = peak FLOP/s / HBM bytes/s; a step whose arithmetic
intensity (FLOPs / bytes moved) is below it is bandwidth-bound.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RooflinePlan:
    peak_flops: float
    bandwidth_bytes_s: float
    machine_balance: float  # FLOP per byte
    weights_bytes: int
    kv_bytes_per_step: float  # an int for whole batch and context
    bytes_per_step: float
    flops_per_step: float
    arithmetic_intensity: float
    bound: str  # "bandwidth" or "compute"
    step_seconds: float
    tokens_per_s: float  # whole batch
    tokens_per_s_per_stream: float


def plan_roofline(
    *,
    params: int,
    weight_dtype_bytes: int,
    peak_tflops: float,
    hbm_tb_s: float,
    gpus: int = 1,
    batch: float = 1,  # a mean batch (Little's law, plan pd) may be fractional
    kv_bytes_per_token: int = 0,
    context: float = 0,
) -> RooflinePlan:
    # one message per value, named as the CLI option that sets it, so a usage error says what to fix
    for name, value, low, strict in (
        ("params", params, 0, True),
        ("weight dtype bytes", weight_dtype_bytes, 0, True),
        ("--tflops", peak_tflops, 0, True),
        ("--tb-s", hbm_tb_s, 0, True),
        ("--gpus", gpus, 1, False),
        ("--batch", batch, 1, False),
        ("--context", context, 0, False),
        ("KV bytes per token", kv_bytes_per_token, 0, False),
    ):
        if value < low or (strict and value == low):
            raise ValueError(f"{name} must be {'>' if strict else '>='} {low}, got {value:g}")
    peak = peak_tflops * 1e12 * gpus
    bw = hbm_tb_s * 1e12 * gpus
    weights = params * weight_dtype_bytes
    kv = batch * context * kv_bytes_per_token
    moved = weights + kv
    flops = 2.0 * params * batch
    intensity = flops / moved
    balance = peak / bw
    step = max(moved / bw, flops / peak)
    bound = "bandwidth" if moved / bw >= flops / peak else "compute"
    return RooflinePlan(
        peak_flops=peak,
        bandwidth_bytes_s=bw,
        machine_balance=balance,
        weights_bytes=weights,
        kv_bytes_per_step=kv,
        bytes_per_step=moved,
        flops_per_step=flops,
        arithmetic_intensity=intensity,
        bound=bound,
        step_seconds=step,
        tokens_per_s=batch / step,
        tokens_per_s_per_stream=1.0 / step,
    )


def prefill_flops(
    *, params: int, tokens: int, layers: int = 0, qk_dim: int = 0, v_dim: int = 0
) -> int:
    """FLOPs to prefill `tokens` tokens from scratch (causal attention), exact integers.

    Weights: 2 x params per token (one multiply-add per parameter; `params` = the active ones of an MoE),
    the decode step's count above. Attention: token i attends to i keys, 2 x i x qk_dim for the logits
    and 2 x i x v_dim for the weighted sum per layer (Hoffmann et al. 2022, "Training Compute-Optimal
    Large Language Models", appendix F, counted causally), summed over i = 1..N:
    layers x (qk_dim + v_dim) x N x (N + 1). qk_dim / v_dim are heads x per-head width.
    """
    for name, value in (("params", params), ("tokens", tokens), ("layers", layers),
                        ("qk_dim", qk_dim), ("v_dim", v_dim)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    return 2 * params * tokens + layers * (qk_dim + v_dim) * tokens * (tokens + 1)
