"""`inferctl plan tiers`: capacity of HBM / host DRAM / storage KV tiers, SGLang's host-pool sizing next to
the user's, and whether loading a cached prefix from each tier beats recomputing it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.cli.common import JsonOpt, finish, session
from infer_ctl.cli.plan_common import (
    DtypeOpt,
    HeadDimOpt,
    KvHeadsOpt,
    KvLoraRankOpt,
    LayersOpt,
    ModelOpt,
    RopeDimOpt,
    finite_options,
    guard,
    human_bytes,
    kv_shape,
    kv_table,
    positive_options,
    seconds,
    shape_dict,
)
from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.report import Report
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.tiers import (
    SGLANG_DEFAULT_HOST_FRACTION,
    SGLANG_HOST_RESERVE_BYTES,
    Compute,
    HostPool,
    TierInputs,
    TierPlan,
    plan_tiers,
)
from infer_ctl.errors import UsageError

_GB = 1e9
#: the GPUs of one HGX-class node: a TP beyond it spans nodes (the ranks-per-host warning only)
_GPUS_PER_NODE = 8


def tiers(
    model: ModelOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    kv_lora_rank: KvLoraRankOpt = None,
    rope_dim: RopeDimOpt = None,
    dtype: DtypeOpt = "bf16",
    params_b: Annotated[float | None, typer.Option("--params-b", help="Parameters used per token, billions (default: the preset's; MoE: active).")] = None,
    attention_heads: Annotated[int | None, typer.Option("--attention-heads", help="Query heads, for attention FLOPs (default: preset, else --kv-heads).")] = None,
    qk_head_dim: Annotated[int | None, typer.Option("--qk-head-dim", help="Query/key width per head if not --head-dim (MLA: nope + rope).")] = None,
    weights_gb: Annotated[float | None, typer.Option("--weights-gb", help="Weights of one replica in GB (default: preset params x --weight-dtype).")] = None,
    weight_dtype: Annotated[str, typer.Option("--weight-dtype", help="Weight dtype for the default --weights-gb.")] = "bf16",
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel ranks of one replica.")] = 8,
    accelerator: Annotated[str, typer.Option("--accelerator", "-x", help="GPU preset: HBM size and peak FLOPs.")] = "h100-sxm",
    hbm_gb: Annotated[float | None, typer.Option("--hbm-gb", help="HBM per GPU in GB (10^9 B; default: the accelerator's).")] = None,
    tflops: Annotated[float | None, typer.Option("--tflops", help="Peak dense FP16/BF16 TFLOPS per GPU (default: the accelerator's).")] = None,
    efficiency: Annotated[float, typer.Option("--efficiency", help="Prefill MFU: achieved / peak FLOPs.")] = 0.5,
    mem_fraction: Annotated[float, typer.Option("--mem-fraction", help="SGLang --mem-fraction-static.")] = 1.0,
    page_size: Annotated[int, typer.Option("--page-size", help="SGLang --page-size (64 with HiCache).")] = 64,
    context: Annotated[int, typer.Option("--context", help="L: tokens of one session.")] = 8192,
    prefix: Annotated[int, typer.Option("--prefix", help="N: cached prefix whose hit is weighed.")] = 8192,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Sessions active in HBM (not cache).")] = 0,
    max_prefix: Annotated[int | None, typer.Option("--max-prefix", help="Longest prefix considered (default: the model's context length).")] = None,
    host_ram_gb: Annotated[float | None, typer.Option("--host-ram-gb", help="Available host RAM per node, GB, as the cgroup sees it.")] = None,
    host_reserve_gib: Annotated[
        float, typer.Option("--host-reserve-gib", help="Host RAM kept free (SGLang 0.5.23: fixed 10 GiB).")
    ] = SGLANG_HOST_RESERVE_BYTES / 1024**3,
    ranks_per_host: Annotated[int | None, typer.Option("--ranks-per-host", help="Ranks sharing one node's RAM (default: --tp).")] = None,
    hicache_ratio: Annotated[float | None, typer.Option("--hicache-ratio", help="Your host/device pool ratio (turns auto-sizing off).")] = None,
    hicache_size: Annotated[int | None, typer.Option("--hicache-size", help="Your host pool per rank in GB (turns auto-sizing off).")] = None,
    hicache_host_memory_fraction: Annotated[
        float, typer.Option("--hicache-host-memory-fraction", help="SGLang auto-sizing share of host RAM.")
    ] = SGLANG_DEFAULT_HOST_FRACTION,
    pcie_gbs: Annotated[float, typer.Option("--pcie-gbs", help="Host -> GPU GB/s per GPU, effective.")] = 50.0,
    pcie_latency_us: Annotated[float, typer.Option("--pcie-latency-us", help="Per host load.")] = 0.0,
    storage_tb: Annotated[float | None, typer.Option("--storage-tb", help="Storage tier capacity for this replica, TB (10^12 B).")] = None,
    storage_gbs: Annotated[float | None, typer.Option("--storage-gbs", help="Storage read GB/s per node, effective.")] = None,
    storage_latency_us: Annotated[float, typer.Option("--storage-latency-us", help="Per storage load.")] = 0.0,
    storage_page_overhead_us: Annotated[
        float, typer.Option("--storage-page-overhead-us", help="Per page read (open/lookup/request).")
    ] = 0.0,
    fabric_gbps: Annotated[float | None, typer.Option("--fabric-gbps", help="Remote store: NIC Gb/s per node capping the read.")] = None,
    json: JsonOpt = False,
) -> None:
    """Tokens each KV tier holds and whether a hit in it beats recomputing the prefix (break-even length)."""
    sess = session(json)
    finite_options({"--params-b": params_b, "--weights-gb": weights_gb, "--hbm-gb": hbm_gb, "--tflops": tflops,
                    "--efficiency": efficiency, "--mem-fraction": mem_fraction, "--host-ram-gb": host_ram_gb,
                    "--host-reserve-gib": host_reserve_gib, "--hicache-ratio": hicache_ratio,
                    "--hicache-host-memory-fraction": hicache_host_memory_fraction, "--pcie-gbs": pcie_gbs,
                    "--pcie-latency-us": pcie_latency_us, "--storage-tb": storage_tb, "--storage-gbs": storage_gbs,
                    "--storage-latency-us": storage_latency_us,
                    "--storage-page-overhead-us": storage_page_overhead_us, "--fabric-gbps": fabric_gbps},
                   "plan tiers")  # before any int(): NaN / inf crash there, or pass every range test
    positive_options(attention_heads=attention_heads, qk_head_dim=qk_head_dim, max_prefix=max_prefix)
    preset, shape = kv_shape(model, layers, kv_heads, head_dim, kv_lora_rank, rope_dim)
    dbytes = guard(presets.dtype_bytes, dtype)
    acc = guard(presets.accelerator_preset, accelerator)
    if params_b is not None and params_b <= 0:
        raise UsageError(f"--params-b must be > 0, got {params_b:g}", remedy="e.g. --params-b 70")
    params = int(params_b * _GB) if params_b is not None else (preset.flops_params if preset else None)
    if params is None:
        raise UsageError("recompute time needs the parameter count: give --model PRESET or --params-b N",
                         remedy="e.g. --params-b 70 (MoE: the active parameters)")
    all_params = preset.params if preset else params
    weights = int(weights_gb * _GB) if weights_gb is not None else all_params * guard(presets.dtype_bytes, weight_dtype)
    heads = attention_heads if attention_heads is not None else (preset.attention_heads if preset else shape.kv_heads)
    qk = qk_head_dim if qk_head_dim is not None else (
        preset.qk_head_dim if preset and preset.qk_head_dim else shape.head_dim)
    if efficiency <= 0 or efficiency > 1:
        raise UsageError(f"--efficiency must be in (0, 1], got {efficiency:g}", remedy="e.g. --efficiency 0.5")
    peak = tflops if tflops is not None else acc.fp16_tflops
    inputs = TierInputs(
        tp=tp,
        hbm_bytes_per_gpu=int((hbm_gb if hbm_gb is not None else acc.hbm_gb) * _GB),
        weights_bytes=weights,
        compute=Compute(flops_per_s=peak * 1e12 * tp * efficiency, params=params, layers=shape.layers,
                        qk_dim=heads * qk, v_dim=heads * shape.head_dim),
        page_size=page_size,
        mem_fraction=mem_fraction,
        context=context,
        prefix=prefix,
        concurrency=concurrency,
        max_prefix=max_prefix if max_prefix is not None else (preset.context_length if preset and preset.context_length else 131072),
        ranks_per_host=ranks_per_host,
        host_available_bytes=None if host_ram_gb is None else int(host_ram_gb * _GB),
        host_reserve_bytes=int(host_reserve_gib * 1024**3),
        host_memory_fraction=hicache_host_memory_fraction,
        hicache_ratio=hicache_ratio,
        hicache_size_gb=hicache_size,
        pcie_bytes_s=pcie_gbs * _GB,
        pcie_latency_s=pcie_latency_us * 1e-6,
        storage_bytes=None if storage_tb is None else int(storage_tb * 1e12),
        storage_read_bytes_s=None if storage_gbs is None else storage_gbs * _GB,
        storage_latency_s=storage_latency_us * 1e-6,
        storage_page_overhead_s=storage_page_overhead_us * 1e-6,
        fabric_bytes_s=None if fabric_gbps is None else fabric_gbps * _GB / 8,
    )
    if host_reserve_gib < 0:
        raise UsageError(f"--host-reserve-gib must be >= 0, got {host_reserve_gib:g}", remedy="SGLang's is 10")
    # the attention heads' TP check only when they are known (given, or the preset's), not the fallback guess
    known_heads = attention_heads if attention_heads is not None else (preset.attention_heads if preset else None)
    plan: TierPlan = guard(plan_tiers, shape, dbytes, inputs, known_heads)
    report = Report(
        "plan tiers",
        None,
        data={
            "model": preset.name if preset else None,
            "dtype": dtype,
            **shape_dict(shape),
            "tp": tp,
            "accelerator": acc.name,
            "inputs": _inputs_doc(inputs),
            **asdict(plan),
        },
    )
    report.extend(_findings(plan))
    if ranks_per_host is None and tp > _GPUS_PER_NODE and plan.host_auto is not None:
        report.extend([Finding(
            check="plan.tiers.ranks_per_host", node="local", status=Status.WARN, subject="--ranks-per-host",
            message=f"--ranks-per-host defaults to --tp {tp}, so the host RAM is split {tp} ways; a TP {tp} replica "
                    f"usually spans nodes of {_GPUS_PER_NODE} GPUs, and SGLang splits each node's RAM over the ranks "
                    "on that node (launch world size // nodes, pool_host/base.py ranks_per_host)",
            remedy=f"give --ranks-per-host (e.g. {_GPUS_PER_NODE} for {tp // _GPUS_PER_NODE} nodes of "
                   f"{_GPUS_PER_NODE} GPUs)",
        )])
    finish(sess, report, lambda c: _render(c, plan, inputs, preset.name if preset else "custom", dtype))


def _inputs_doc(inp: TierInputs) -> dict[str, Any]:
    doc = asdict(inp)
    doc["ranks_per_host"] = inp.ranks_on_host
    return doc


def _findings(plan: TierPlan) -> list[Finding]:
    out = []
    for pool in (plan.host_explicit, plan.host_auto):
        if pool is not None and pool.fits is False:
            out.append(Finding(
                check="plan.tiers.host_fit", node="local", status=Status.WARN, subject=pool.source,
                message=f"host pool of {pool.bytes_per_rank:,} B per rank exceeds what SGLang lets a rank take "
                        f"({pool.budget_per_rank:,} B): it refuses to start" if pool.tokens else pool.note or "",
                remedy="lower --hicache-ratio / --hicache-size, or give the node more RAM",
            ))
    chosen = plan.host_chosen
    if chosen is not None and chosen.tokens and chosen.smaller_than_device:
        out.append(Finding(
            check="plan.tiers.host_small", node="local", status=Status.WARN, subject=chosen.source,
            message=f"host pool ({chosen.tokens:,} tokens) is not larger than the device pool: SGLang warns "
                    "that L2 cache effectiveness is reduced",
            remedy="a host tier pays only when it holds more than HBM: raise the ratio above 1",
        ))
    return out


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:,.2f} GiB"


def _host_row(t: Table, label: str, pool: HostPool | None) -> None:
    if pool is None:
        t.add_row(label, "-", "-", "-", "-", "-")
        return
    fits = "-" if pool.fits is None else "yes" if pool.fits else "NO"
    t.add_row(label, "-" if pool.ratio is None else f"{pool.ratio:.4g}", f"{pool.tokens:,}",
              _gib(pool.bytes_per_rank), _gib(pool.bytes_per_host), fits)


def _render(c: Console, plan: TierPlan, inp: TierInputs, name: str, dtype: str) -> None:
    c.print(kv_table({
        "KV bytes per token (one copy)": human_bytes(plan.kv_bytes_per_token),
        f"KV bytes per token per rank (TP {inp.tp})": human_bytes(plan.kv_bytes_per_token_per_rank),
        "page size": plan.page_size,
        "prefill compute (FLOP/s, peak x GPUs x efficiency)": inp.compute.flops_per_s,
    }, f"KV tiers — {name}, KV {dtype}"))
    cap = Table("tier", "tokens", "per rank", "replica", f"sessions @ {inp.context:,}",
                "prefix tokens", title="capacity (per replica: every rank holds its part of each cached token)")
    for t in plan.capacities:
        cap.add_row(t.tier, f"{t.tokens:,}", _gib(t.bytes_per_rank), _gib(t.bytes_total),
                    f"{t.sessions:,}", f"{t.prefix_tokens:,}")
    c.print(cap)
    host = Table("host pool", "ratio", "tokens", "per rank", "per host", "fits", title="host DRAM pool (HiCache)")
    _host_row(host, "SGLang 0.5.23 auto-size", plan.host_auto)
    _host_row(host, f"yours ({plan.host_explicit.source})" if plan.host_explicit else "yours (none given)",
              plan.host_explicit)
    c.print(host)
    loads = Table("tier", "prefix", "load", "recompute", "pays?", "load us/tok",
                  "recompute us/tok", "break-even", title=f"hit vs recompute, prefix {inp.prefix:,} tokens")
    nevers = []
    for ld in plan.loads:
        be = f"{ld.break_even_tokens:,}" if ld.break_even_tokens is not None else "never*"
        if ld.never:
            nevers.append(f"* {ld.tier}: {ld.never}")
        loads.add_row(ld.tier, f"{ld.prefix_tokens:,}", seconds(ld.load_seconds), seconds(ld.recompute_seconds),
                      "yes" if ld.pays else "NO", f"{ld.load_seconds_per_token * 1e6:.3f}",
                      f"{ld.recompute_seconds_per_token * 1e6:.3f}", be)
    c.print(loads)
    for line in nevers:
        c.print(line)
    if plan.host_explicit is None and plan.host_auto is None:
        c.print("host pool: give --host-ram-gb (SGLang's auto-sizing) or --hicache-ratio / --hicache-size")
    c.print("assumptions: " + "; ".join(plan.assumptions), style="dim")
