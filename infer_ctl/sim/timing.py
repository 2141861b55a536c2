"""The simulator's timing model, derived from the sizing math in `infer_ctl.core.sizing`.

- Prefill: compute-bound; tokens/s = GPUs x peak FLOP/s x MFU / (2 x params). Only uncached tokens
  cost time; a forward handles at most `chunked_prefill_size` tokens (chunked prefill).
- Decode: one step reads all weights plus the batch's KV bytes from HBM (the roofline's bandwidth
  bound, `core.sizing.roofline.plan_roofline`), scaled by a bandwidth efficiency, plus a fixed per-step
  overhead (kernel launches, sampling, scheduling).
- Speculative decoding: a verification step costs (gamma x c + 1) target steps and yields N tokens with
  E[N] = (1 - a^(g+1)) / (1 - a) (`core.sizing.spec`), so throughput gains S = E[N] / (g*c + 1).
- KV transfer prefill -> decode: bytes / NIC bandwidth + latency (`core.sizing.transfer`).

Presets name a hardware/model pair; every number can be overridden.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from infer_ctl.core.sizing import presets as hw
from infer_ctl.core.sizing.kv import kv_bytes_per_token, plan_kv
from infer_ctl.core.sizing.roofline import plan_roofline
from infer_ctl.core.sizing.spec import expected_tokens
from infer_ctl.core.sizing.transfer import plan_transfer


@dataclass(frozen=True)
class SimPreset:
    name: str
    model: str  # core.sizing.presets model name
    prefill_accelerator: str
    decode_accelerator: str
    gpus: int = 8  # TP size of one server
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    mem_fraction: float = 0.85  # SGLang's --mem-fraction-static covers weights + KV pool
    prefill_mfu: float = 0.5
    bandwidth_efficiency: float = 0.8
    step_overhead_s: float = 0.002
    max_running_requests: int = 48  # SGLang's default with EAGLE
    chunked_prefill_size: int = 8192
    spec_alpha: float | None = 0.8  # None = no speculative decoding
    spec_gamma: int = 3  # --speculative-num-steps 3, topk 1, num_draft_tokens 4
    spec_cost_ratio: float = 0.1
    nic_gbps: float = 400.0
    nic_links: int = 8
    nic_latency_us: float = 10.0


PRESETS: dict[str, SimPreset] = {
    p.name: p
    for p in (
        SimPreset("h100-h200-llama-3.1-70b-eagle3", "llama-3.1-70b", "h100-sxm", "h200"),
        SimPreset("h100-llama-3.1-70b", "llama-3.1-70b", "h100-sxm", "h100-sxm", spec_alpha=None),
        SimPreset(
            "h100-llama-3.1-8b-eagle3", "llama-3.1-8b", "h100-sxm", "h100-sxm", gpus=1, spec_alpha=0.75
        ),
    )
}
DEFAULT_PRESET = "h100-h200-llama-3.1-70b-eagle3"


def preset(name: str) -> SimPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown simulator preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class TimingModel:
    """Resolved numbers for one worker (model seconds; the worker divides wall time by time_scale)."""

    prefill_tokens_per_s: float
    weights_bytes: int
    kv_bytes_per_token: int
    decode_bandwidth_bytes_s: float
    step_overhead_s: float
    chunked_prefill_size: int
    max_running_requests: int
    kv_capacity_tokens: int
    spec_alpha: float | None
    spec_gamma: int
    spec_cost_ratio: float
    nic_gbps: float
    nic_links: int
    nic_latency_us: float

    def prefill_seconds(self, tokens: int) -> float:
        return self.step_overhead_s + tokens / self.prefill_tokens_per_s

    def target_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One target-model forward over a decode batch holding `context_tokens` KV tokens in all."""
        bytes_moved = self.weights_bytes + context_tokens * self.kv_bytes_per_token
        return self.step_overhead_s + bytes_moved / self.decode_bandwidth_bytes_s

    def decode_step_seconds(self, batch: int, context_tokens: int, steps: int | None = None) -> float:
        """A decode step; with speculation `steps` draft steps (default: the launch gamma; the adaptive
        controller picks others) plus one verification, i.e. (steps x c + 1) target steps."""
        base = self.target_step_seconds(batch, context_tokens)
        if self.spec_alpha is None:
            return base
        gamma = self.spec_gamma if steps is None else steps
        return base * (gamma * self.spec_cost_ratio + 1.0)

    def transfer_seconds(self, tokens: int) -> float:
        nbytes = tokens * self.kv_bytes_per_token
        return plan_transfer(nbytes, self.nic_gbps, self.nic_latency_us, self.nic_links).seconds

    @property
    def expected_tokens_per_step(self) -> float:
        return 1.0 if self.spec_alpha is None else expected_tokens(self.spec_alpha, self.spec_gamma)


def resolve_timing(
    preset_name: str = DEFAULT_PRESET,
    role: str = "mixed",
    *,
    cache_capacity_tokens: int | None = None,
    speculative: bool | None = None,
    **overrides: float | int | None,
) -> TimingModel:
    """Numbers for one worker from a preset; `overrides` replace preset fields (None = keep)."""
    p = preset(preset_name)
    kept: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    p = replace(p, **kept)
    if speculative is False:
        p = replace(p, spec_alpha=None)
    elif speculative and p.spec_alpha is None:
        p = replace(p, spec_alpha=0.8)
    model = hw.model_preset(p.model)
    accel = hw.accelerator_preset(p.prefill_accelerator if role == "prefill" else p.decode_accelerator)
    wbytes = hw.dtype_bytes(p.weight_dtype)
    kv_per_token = kv_bytes_per_token(
        model.layers, model.kv_heads, model.head_dim, hw.dtype_bytes(p.kv_dtype)
    )
    roof = plan_roofline(
        params=model.params,
        weight_dtype_bytes=wbytes,
        peak_tflops=accel.fp16_tflops,
        hbm_tb_s=accel.hbm_tb_s,
        gpus=p.gpus,
    )
    if cache_capacity_tokens is None:
        kv = plan_kv(
            layers=model.layers,
            kv_heads=model.kv_heads,
            head_dim=model.head_dim,
            dtype_bytes=hw.dtype_bytes(p.kv_dtype),
            context=1,
            hbm_bytes=int(accel.hbm_gb * 1e9 * p.gpus),
            weights_bytes=roof.weights_bytes,
            mem_fraction=p.mem_fraction,
        )
        cache_capacity_tokens = max(1, kv.max_tokens or 1)
    return TimingModel(
        prefill_tokens_per_s=roof.peak_flops * p.prefill_mfu / (2.0 * model.params),
        weights_bytes=roof.weights_bytes,
        kv_bytes_per_token=kv_per_token,
        decode_bandwidth_bytes_s=roof.bandwidth_bytes_s * p.bandwidth_efficiency,
        step_overhead_s=p.step_overhead_s,
        chunked_prefill_size=p.chunked_prefill_size,
        max_running_requests=p.max_running_requests,
        kv_capacity_tokens=cache_capacity_tokens,
        spec_alpha=p.spec_alpha,
        spec_gamma=p.spec_gamma,
        spec_cost_ratio=p.spec_cost_ratio,
        nic_gbps=p.nic_gbps,
        nic_links=p.nic_links,
        nic_latency_us=p.nic_latency_us,
    )


def draw_accepted(rng: random.Random, alpha: float, gamma: int) -> int:
    """Drafts accepted in one verification: each of gamma drafts is accepted with probability alpha
    until the first rejection (the i.i.d. model behind Leviathan et al.'s E[N]). Tokens produced by
    the step = accepted + 1 (the target's bonus/correction token)."""
    accepted = 0
    while accepted < gamma and rng.random() < alpha:
        accepted += 1
    return accepted
