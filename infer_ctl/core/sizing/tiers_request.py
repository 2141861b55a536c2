"""`plan tiers` from what it was given to its numbers and findings: the options (as given, None for left
out) resolved against the model and accelerator presets into TierInputs, planned, and judged.

One function for the CLI to call (cli/plan_tiers.py parses, calls `tiers_outcome`, renders).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.inputs import InputError, kv_shape, positive_options, shape_dict
from infer_ctl.core.sizing.tiers import Compute, TierInputs, TierPlan, plan_tiers
from infer_ctl.core.sizing.verdicts import tiers_findings

_GB = 1e9
#: the longest prefix considered when neither --max-prefix nor the preset's context length says
_DEFAULT_MAX_PREFIX = 131072


@dataclass(frozen=True)
class TiersRequest:
    """The options of `plan tiers`, named as the flags (None: left out)."""

    model: str | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    kv_lora_rank: int | None
    rope_dim: int | None
    dtype: str
    params_b: float | None
    attention_heads: int | None
    qk_head_dim: int | None
    weights_gb: float | None
    weight_dtype: str
    tp: int
    accelerator: str
    hbm_gb: float | None
    tflops: float | None
    efficiency: float
    mem_fraction: float
    page_size: int
    context: int
    prefix: int
    concurrency: int
    max_prefix: int | None
    host_ram_gb: float | None
    host_reserve_gib: float
    ranks_per_host: int | None
    hicache_ratio: float | None
    hicache_size: int | None
    hicache_host_memory_fraction: float
    pcie_gbs: float
    pcie_latency_us: float
    storage_tb: float | None
    storage_gbs: float | None
    storage_latency_us: float
    storage_page_overhead_us: float
    fabric_gbps: float | None


@dataclass(frozen=True)
class TiersOutcome:
    plan: TierPlan
    inputs: TierInputs
    model_name: str  # the preset's, or "custom"
    data: dict[str, Any]  # the report's payload
    findings: list[Finding]


def tiers_outcome(r: TiersRequest) -> TiersOutcome:
    """Resolve, plan and judge; an impossible input raises ValueError (InputError: with its remedy)."""
    positive_options(attention_heads=r.attention_heads, qk_head_dim=r.qk_head_dim, max_prefix=r.max_prefix)
    preset, shape = kv_shape(r.model, r.layers, r.kv_heads, r.head_dim, r.kv_lora_rank, r.rope_dim)
    dbytes = presets.dtype_bytes(r.dtype)
    acc = presets.accelerator_preset(r.accelerator)
    if r.params_b is not None and r.params_b <= 0:
        raise InputError(f"--params-b must be > 0, got {r.params_b:g}", remedy="e.g. --params-b 70")
    params = int(r.params_b * _GB) if r.params_b is not None else (preset.flops_params if preset else None)
    if params is None:
        raise InputError("recompute time needs the parameter count: give --model PRESET or --params-b N",
                         remedy="e.g. --params-b 70 (MoE: the active parameters)")
    all_params = preset.params if preset else params
    weights = int(r.weights_gb * _GB) if r.weights_gb is not None else all_params * presets.dtype_bytes(r.weight_dtype)
    heads = r.attention_heads if r.attention_heads is not None else (
        preset.attention_heads if preset else shape.kv_heads)
    qk = r.qk_head_dim if r.qk_head_dim is not None else (
        preset.qk_head_dim if preset and preset.qk_head_dim else shape.head_dim)
    if r.efficiency <= 0 or r.efficiency > 1:
        raise InputError(f"--efficiency must be in (0, 1], got {r.efficiency:g}", remedy="e.g. --efficiency 0.5")
    peak = r.tflops if r.tflops is not None else acc.fp16_tflops
    inputs = TierInputs(
        tp=r.tp,
        hbm_bytes_per_gpu=int((r.hbm_gb if r.hbm_gb is not None else acc.hbm_gb) * _GB),
        weights_bytes=weights,
        compute=Compute(flops_per_s=peak * 1e12 * r.tp * r.efficiency, params=params, layers=shape.layers,
                        qk_dim=heads * qk, v_dim=heads * shape.head_dim),
        page_size=r.page_size,
        mem_fraction=r.mem_fraction,
        context=r.context,
        prefix=r.prefix,
        concurrency=r.concurrency,
        max_prefix=r.max_prefix if r.max_prefix is not None else (
            preset.context_length if preset and preset.context_length else _DEFAULT_MAX_PREFIX),
        ranks_per_host=r.ranks_per_host,
        host_available_bytes=None if r.host_ram_gb is None else int(r.host_ram_gb * _GB),
        host_reserve_bytes=int(r.host_reserve_gib * 1024**3),
        host_memory_fraction=r.hicache_host_memory_fraction,
        hicache_ratio=r.hicache_ratio,
        hicache_size_gb=r.hicache_size,
        pcie_bytes_s=r.pcie_gbs * _GB,
        pcie_latency_s=r.pcie_latency_us * 1e-6,
        storage_bytes=None if r.storage_tb is None else int(r.storage_tb * 1e12),
        storage_read_bytes_s=None if r.storage_gbs is None else r.storage_gbs * _GB,
        storage_latency_s=r.storage_latency_us * 1e-6,
        storage_page_overhead_s=r.storage_page_overhead_us * 1e-6,
        fabric_bytes_s=None if r.fabric_gbps is None else r.fabric_gbps * _GB / 8,
    )
    if r.host_reserve_gib < 0:
        raise InputError(f"--host-reserve-gib must be >= 0, got {r.host_reserve_gib:g}", remedy="SGLang's is 10")
    # the attention heads' TP check only when they are known (given, or the preset's), not the fallback guess
    known_heads = r.attention_heads if r.attention_heads is not None else (
        preset.attention_heads if preset else None)
    plan = plan_tiers(shape, dbytes, inputs, known_heads)
    inputs_doc = asdict(inputs)
    inputs_doc["ranks_per_host"] = inputs.ranks_on_host
    data = {
        "model": preset.name if preset else None,
        "dtype": r.dtype,
        **shape_dict(shape),
        "tp": r.tp,
        "accelerator": acc.name,
        "inputs": inputs_doc,
        **asdict(plan),
    }
    findings = tiers_findings(plan, tp=r.tp, ranks_per_host_given=r.ranks_per_host is not None)
    return TiersOutcome(plan, inputs, preset.name if preset else "custom", data, findings)
