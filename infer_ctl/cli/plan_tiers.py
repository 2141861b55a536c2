"""`inferctl plan tiers`: capacity of HBM / host DRAM / storage KV tiers, SGLang's host-pool sizing next to
the user's, and whether loading a cached prefix from each tier beats recomputing it."""

from __future__ import annotations

from typing import Annotated

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
    kv_table,
    seconds,
)
from infer_ctl.core.report import Report
from infer_ctl.core.sizing.tiers import (
    SGLANG_DEFAULT_HOST_FRACTION,
    SGLANG_HOST_RESERVE_BYTES,
    HostPool,
    TierInputs,
    TierPlan,
)
from infer_ctl.core.sizing.tiers_request import TiersOutcome, TiersRequest, tiers_outcome


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
    request = TiersRequest(
        model=model, layers=layers, kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank,
        rope_dim=rope_dim, dtype=dtype, params_b=params_b, attention_heads=attention_heads, qk_head_dim=qk_head_dim,
        weights_gb=weights_gb, weight_dtype=weight_dtype, tp=tp, accelerator=accelerator, hbm_gb=hbm_gb,
        tflops=tflops, efficiency=efficiency, mem_fraction=mem_fraction, page_size=page_size, context=context,
        prefix=prefix, concurrency=concurrency, max_prefix=max_prefix, host_ram_gb=host_ram_gb,
        host_reserve_gib=host_reserve_gib, ranks_per_host=ranks_per_host, hicache_ratio=hicache_ratio,
        hicache_size=hicache_size, hicache_host_memory_fraction=hicache_host_memory_fraction, pcie_gbs=pcie_gbs,
        pcie_latency_us=pcie_latency_us, storage_tb=storage_tb, storage_gbs=storage_gbs,
        storage_latency_us=storage_latency_us, storage_page_overhead_us=storage_page_overhead_us,
        fabric_gbps=fabric_gbps)
    out: TiersOutcome = guard(tiers_outcome, request)
    report = Report("plan tiers", None, data=out.data)
    report.extend(out.findings)
    finish(sess, report, lambda c: _render(c, out.plan, out.inputs, out.model_name, dtype))


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
