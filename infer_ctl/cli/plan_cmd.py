"""`inferctl plan kv|spec|transfer|roofline|tiers|cost|pd`: sizing math (pure functions in core.sizing).

kv, spec, transfer and roofline live here; tiers, cost and pd in cli/plan_tiers.py, cli/plan_cost.py and
cli/plan_pd.py;
what they share in cli/plan_common.py.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.cli.common import PROFILE_ENV, JsonOpt, finish, get_profile, session
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
    print_findings,
)
from infer_ctl.cli.plan_cost import cost
from infer_ctl.cli.plan_pd import pd
from infer_ctl.cli.plan_tiers import tiers
from infer_ctl.core.report import Report
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.alignment import DEFAULT_MTU, PageAlignment
from infer_ctl.core.sizing.kv import capacity
from infer_ctl.core.sizing.kv_request import KvOutcome, KvRequest, kv_outcome
from infer_ctl.core.sizing.roofline_request import RooflineOutcome, RooflineRequest, roofline_outcome
from infer_ctl.core.sizing.spec import plan_spec, speedup_table
from infer_ctl.core.sizing.transfer import plan_transfer
from infer_ctl.core.sizing.verdicts import kv_memory
from infer_ctl.errors import UsageError
from infer_ctl.output.json_doc import dumps

app = typer.Typer(
    help="Sizing math: KV footprint and tiers, speculative speedup, KV transfer time, roofline, cost.",
    no_args_is_help=True,
)
app.command("tiers")(tiers)
app.command("cost")(cost)
app.command("pd")(pd)


@app.command("kv")
def kv(
    model: ModelOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    kv_lora_rank: KvLoraRankOpt = None,
    rope_dim: RopeDimOpt = None,
    dtype: DtypeOpt = "bf16",
    context: Annotated[int, typer.Option("--context", help="Tokens per request.")] = 8192,
    hbm_gb: Annotated[
        float | None, typer.Option("--hbm-gb", help="HBM per replica in GB (10^9 bytes).")
    ] = None,
    weights_gb: Annotated[
        float | None, typer.Option("--weights-gb", help="Weights in GB (default: preset params x 2 bytes).")
    ] = None,
    mem_fraction: Annotated[
        float | None, typer.Option("--mem-fraction", help="SGLang --mem-fraction-static: share of each GPU for "
                                   "weights + KV pool (default: SGLang 0.5.23's own rule for the GPU size and TP).")
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", help="Tensor-parallel ranks, for the page per rank (default: 1, "
                                 "or the profile's models.target.tp).")
    ] = None,
    page_size: Annotated[
        int, typer.Option("--page-size", help="SGLang --page-size (its default is 1; 64 with HiCache storage).")
    ] = 1,
    mtu: Annotated[
        int | None, typer.Option("--mtu", help=f"RDMA path MTU in bytes (default: the profile's fabric.mtu, "
                                 f"else {DEFAULT_MTU}).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", envvar=PROFILE_ENV, show_envvar=False, help="Take --mtu and --tp from this profile (default: $INFERCTL_PROFILE).")
    ] = None,
    list_presets: Annotated[
        bool, typer.Option("--list-presets", help="List model presets and exit.")
    ] = False,
    json: JsonOpt = False,
) -> None:
    """KV bytes per token and request, how many requests fit in HBM, and KV page vs MTU / cache line."""
    sess = session(json)
    if list_presets:
        _list_presets(sess.out, json)
    finite_options({"--hbm-gb": hbm_gb, "--weights-gb": weights_gb, "--mem-fraction": mem_fraction}, "plan kv")
    prof = get_profile(profile) if profile else None
    out: KvOutcome = guard(kv_outcome, KvRequest(
        model=model, layers=layers, kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank,
        rope_dim=rope_dim, dtype=dtype, context=context, hbm_gb=hbm_gb, weights_gb=weights_gb,
        mem_fraction=mem_fraction, tp=tp, page_size=page_size, mtu=mtu,
        profile_mtu=prof.fabric.mtu if prof else None,
        profile_tp=prof.models.target.tp if prof and prof.models else None))
    plan, fraction = out.plan, out.fraction
    report = Report("plan kv", profile=prof.name if prof else None, data=out.data)
    report.extend(kv_memory(plan, mem_fraction=fraction.fraction))
    rows = {
        "KV bytes per token": human_bytes(plan.kv_bytes_per_token),
        f"KV bytes per request ({context:,} tokens)": human_bytes(plan.kv_bytes),
        "weights": human_bytes(plan.weights_bytes),
        "mem fraction static": f"{fraction.fraction:g}" if out.hbm_given else "-",
        "KV budget": human_bytes(plan.kv_budget_bytes),
        "max tokens in KV pool": "-" if plan.max_tokens is None else f"{plan.max_tokens:,}",
        "max concurrent full-context requests": "-"
        if plan.max_concurrent is None
        else f"{plan.max_concurrent:,}",
        **_alignment_rows(out.align, out.is_mla, out.tp),
    }

    def render(c: Console) -> None:
        c.print(kv_table(rows, f"KV footprint — {out.model_name or 'custom'}, {dtype}"))
        frac = f"{fraction.fraction:g}" if out.hbm_given else "-"
        c.print(f"defaults used: TP {out.tp} ({out.tp_source}), MTU {out.mtu:,} ({out.mtu_source}), mem fraction "
                f"{frac} ({fraction.source})", style="dim", highlight=False)
        print_findings(c, report.findings)

    finish(sess, report, render)


def _alignment_rows(a: PageAlignment, mla: bool, tp: int) -> dict[str, str]:
    what = "latent" if mla else "K (V the same, separate buffer)"
    sizes = ", ".join(str(p) for p in a.aligned_page_sizes) or f"multiples of {a.min_aligned_page}"
    return {
        f"page bytes per layer per rank ({a.page_size} tok x {a.row_bytes:,} B {what}, TP {tp})": f"{a.page_bytes:,} B",
        f"RDMA packets per page (MTU {a.mtu:,})": f"{a.packets:,}"
        + ("" if a.fills_mtu else f" (last {a.last_packet_bytes:,} B: partial)"),
        "fills whole MTU packets": "yes" if a.fills_mtu else f"no (needs page size a multiple of {a.min_page_for_mtu})",
        f"fills whole {a.cache_line}-byte cache lines": "yes"
        if a.fills_cache_lines
        else f"no (needs page size a multiple of {a.min_page_for_cache_line})",
        "aligned page sizes": sizes,
    }


def _kv_layout(m: presets.ModelPreset) -> str:
    """What the KV math multiplies: an MLA model caches one latent per token, not K and V per KV head
    (its 128 attention heads are no KV heads), so its head count would mislead here."""
    if m.kv_lora_rank is not None:
        rope = m.qk_rope_head_dim or 0
        return f"MLA: 1 latent of {m.kv_lora_rank} + {rope} rope = {m.kv_lora_rank + rope} values"
    return f"K and V: {m.kv_heads} KV heads x {m.head_dim}"


def _list_presets(out: Console, json: bool) -> None:
    models = {k: asdict(v) for k, v in presets.MODELS.items()}
    accels = {k: asdict(v) for k, v in presets.ACCELERATORS.items()}
    if json:
        typer.echo(dumps({"models": models, "accelerators": accels}))
    else:
        table = Table("model", "layers", "KV cache per token per layer", "params", title="model presets")
        for m in presets.MODELS.values():
            table.add_row(m.name, str(m.layers), _kv_layout(m), f"{m.params:,}")
        out.print(table)
        atable = Table("accelerator", "FP16 dense TFLOPS", "memory TB/s", "memory GB", title="accelerator presets")
        for a in presets.ACCELERATORS.values():
            atable.add_row(a.name, f"{a.fp16_tflops:g}", f"{a.hbm_tb_s:g}", f"{a.hbm_gb:g}")
        out.print(atable)
    raise typer.Exit(0)


@app.command("spec")
def spec(
    alpha: Annotated[float, typer.Option("--alpha", "-a", help="Per-token acceptance rate in [0, 1].")] = 0.8,
    gamma: Annotated[int, typer.Option("--gamma", "-g", help="Draft tokens per verification step.")] = 4,
    cost_ratio: Annotated[
        float, typer.Option("--cost-ratio", help="Draft step cost / target step cost.")
    ] = 0.05,
    table: Annotated[
        bool, typer.Option("--table", help="Print speedup over a grid of alpha and gamma.")
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Expected tokens per step E[N] = (1-a^(g+1))/(1-a) and speedup S = E[N]/(g*c+1)."""
    sess = session(json)
    if gamma < 1:
        raise UsageError(f"--gamma must be >= 1, got {gamma}",
                         remedy="gamma 0 drafts nothing: no speculative decoding, speedup 1 by definition")
    plan = guard(plan_spec, alpha, gamma, cost_ratio)
    report = Report("plan spec", None, data=asdict(plan))
    if table:
        alphas, gammas = [round(0.5 + 0.05 * i, 2) for i in range(10)], list(range(1, 9))
        grid = guard(speedup_table, alphas, gammas, cost_ratio)
        report.data["table"] = {"alphas": alphas, "gammas": gammas, "speedup": grid}
    rows = {
        "alpha": alpha,
        "gamma": gamma,
        "cost ratio c": cost_ratio,
        "expected tokens E[N]": plan.expected_tokens,
        "speedup S": plan.speedup,
        "break-even alpha": "none (c >= 1)"
        if plan.break_even_alpha is None
        else f"{plan.break_even_alpha:.6f}",
    }

    def render(console: Console) -> None:
        console.print(kv_table(rows, "speculative decoding"))
        if table:
            grid_table = Table(
                "alpha \\ gamma",
                *[str(g) for g in report.data["table"]["gammas"]],
                title=f"speedup S (c = {cost_ratio})",
            )
            for a, row in zip(report.data["table"]["alphas"], report.data["table"]["speedup"], strict=True):
                grid_table.add_row(f"{a:.2f}", *[f"{s:.2f}" for s in row])
            console.print(grid_table)

    finish(sess, report, render)


@app.command("transfer")
def transfer(
    nbytes: Annotated[int | None, typer.Option("--bytes", help="KV bytes to move.")] = None,
    model: ModelOpt = None,
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    dtype: DtypeOpt = "bf16",
    prompt_tokens: Annotated[
        int | None, typer.Option("--prompt-tokens", "-t", help="Prompt length (with a model).")
    ] = None,
    bandwidth_gbps: Annotated[
        float, typer.Option("--bandwidth-gbps", "-b", help="Link rate in Gb/s.")
    ] = 400.0,
    links: Annotated[int, typer.Option("--links", help="NICs used in parallel.")] = 1,
    latency_us: Annotated[float, typer.Option("--latency-us", help="Fabric latency in microseconds.")] = 5.0,
    json: JsonOpt = False,
) -> None:
    """KV handoff time prefill -> decode = bytes / bandwidth + latency."""
    sess = session(json)
    if nbytes is None:
        if prompt_tokens is None:
            raise UsageError(
                "give --bytes, or a model (--model or --layers/--kv-heads/--head-dim) and --prompt-tokens",
                remedy="e.g. inferctl plan transfer --model llama-3.1-70b --prompt-tokens 8192",
            )
        _, shape = kv_shape(model, layers, kv_heads, head_dim)
        nbytes = guard(
            capacity, guard(shape.bytes_per_token, guard(presets.dtype_bytes, dtype)), context=prompt_tokens
        ).kv_bytes
    plan = guard(plan_transfer, nbytes, bandwidth_gbps, latency_us, links)
    report = Report("plan transfer", None, data={**asdict(plan), "prompt_tokens": prompt_tokens})
    rows = {
        "bytes": human_bytes(plan.bytes),
        "bandwidth": f"{bandwidth_gbps:g} Gb/s x {links}",
        "latency": f"{latency_us:g} us",
        "wire time": f"{plan.wire_seconds * 1e3:.4f} ms",
        "handoff time": f"{plan.seconds * 1e3:.4f} ms",
    }
    finish(sess, report, lambda c: c.print(kv_table(rows, "KV transfer")))


@app.command("roofline")
def roofline(
    model: ModelOpt = None,
    params_b: Annotated[
        float | None, typer.Option("--params-b", help="Parameters in billions (instead of --model).")
    ] = None,
    accelerator: Annotated[
        str | None, typer.Option("--accelerator", "-x", help="h100-sxm, h200, b200, mi300x, l40s.")
    ] = "h100-sxm",
    tflops: Annotated[
        float | None, typer.Option("--tflops", help="Peak dense FP16 TFLOPS (overrides preset).")
    ] = None,
    tb_s: Annotated[float | None, typer.Option("--tb-s", help="HBM TB/s (overrides preset).")] = None,
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of one replica (tensor parallel).")] = 1,
    weight_dtype: Annotated[str, typer.Option("--weight-dtype", help="Weight dtype.")] = "bf16",
    batch: Annotated[int, typer.Option("--batch", help="Concurrent sequences per decode step.")] = 1,
    context: Annotated[int, typer.Option("--context", help="Tokens of KV read per sequence per step.")] = 0,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="KV cache dtype: fp16, bf16, fp8, fp32.")] = "bf16",
    layers: LayersOpt = None,
    kv_heads: KvHeadsOpt = None,
    head_dim: HeadDimOpt = None,
    json: JsonOpt = False,
) -> None:
    """Machine balance and bandwidth-bound decode tokens/s (with --context: plus the KV read per step)."""
    sess = session(json)
    out: RooflineOutcome = guard(roofline_outcome, RooflineRequest(
        model=model, params_b=params_b, accelerator=accelerator, tflops=tflops, tb_s=tb_s, gpus=gpus,
        weight_dtype=weight_dtype, batch=batch, context=context, kv_dtype=kv_dtype, layers=layers,
        kv_heads=kv_heads, head_dim=head_dim))
    plan = out.plan
    report = Report("plan roofline", None, data=out.data)
    report.extend(out.findings)
    rows = {
        "machine balance (FLOP/byte)": plan.machine_balance,
        "bytes per decode step": human_bytes(plan.bytes_per_step),
        "arithmetic intensity (FLOP/byte)": plan.arithmetic_intensity,
        "bound": plan.bound,
        "step time (ms)": plan.step_seconds * 1e3,
        "tokens/s (batch)": plan.tokens_per_s,
        "tokens/s per stream": plan.tokens_per_s_per_stream,
    }

    def render(c: Console) -> None:
        c.print(kv_table(rows, f"roofline — {out.accelerator} x{gpus}"))
        print_findings(c, report.findings)

    finish(sess, report, render)
