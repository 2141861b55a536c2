"""`inferctl plan cost`: $ per million input / cached / output tokens for deployment scenarios
(collocated, disaggregated, disaggregated + speculative + radix cache), every input printed and overridable."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.cli.common import PROFILE_ENV, JsonOpt, finish, get_profile, session
from infer_ctl.cli.plan_common import guard
from infer_ctl.core.report import Report
from infer_ctl.core.sizing.cost import ROLES, SCENARIOS, CostPlan, Scenario, Throughput
from infer_ctl.core.sizing.cost_request import (
    CostOutcome,
    CostRequest,
    ProfileDeployment,
    ProfileNode,
    bench_throughput,
    cost_outcome,
)
from infer_ctl.errors import UsageError

if TYPE_CHECKING:
    from infer_ctl.profile import Profile

_PRESETS = [n for n in SCENARIOS if n != "custom"]
_POOL_KEYS = ("nodes", "gpus", "node_hour", "gpu_hour", "accelerator", "tp")
_POOL_HELP = (
    "Override or add a pool: ROLE:key=value,... with ROLE one of collocated, prefill, decode and keys "
    "nodes, gpus (per node), node_hour or gpu_hour ($), accelerator, tp. Repeatable."
)


def _usage(message: str, remedy: str = "see `inferctl plan cost --help`") -> UsageError:
    return UsageError(message, remedy=remedy)


def parse_pool(spec: str) -> tuple[str, dict[str, Any]]:
    role, sep, rest = spec.partition(":")
    role = role.strip()
    if role not in ROLES:
        raise _usage(f"--pool {spec!r}: role must be one of {', '.join(ROLES)}",
                     remedy="e.g. --pool decode:nodes=6,gpus=8,gpu_hour=3.5,accelerator=h200")
    fields: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))) if sep else ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in _POOL_KEYS:
            raise _usage(f"--pool {spec!r}: unknown key {key!r}; keys: {', '.join(_POOL_KEYS)}")
        if key == "accelerator":
            fields[key] = value.strip()
            continue
        try:
            fields[key] = int(value) if key in ("nodes", "gpus", "tp") else float(value)
        except ValueError:
            raise _usage(f"--pool {spec!r}: {key} must be a number, got {value!r}") from None
    if "node_hour" in fields and "gpu_hour" in fields:
        raise _usage(f"--pool {spec!r}: give node_hour or gpu_hour, not both")
    return role, fields


def _deployment(prof: Profile) -> ProfileDeployment:
    """What plan cost reads of a profile (core.sizing.cost_request builds the pools from it)."""
    target = prof.models.target if prof.models else None
    return ProfileDeployment(
        prof.name, prof.description, prof.collocated,
        tuple(ProfileNode(n.name, tuple(map(str, n.roles)), n.gpus, n.labels.get("gpu")) for n in prof.nodes),
        model=target.preset if target else None, tp=target.tp if target else None)


def read_bench(path: str) -> Throughput:
    """A `bench --json` document or a `bench --out` file: both carry the summary."""
    try:
        doc = jsonlib.loads(Path(path).read_text())
    except OSError as exc:
        raise _usage(f"--bench {path}: cannot read it ({exc.strerror or exc})", remedy="check the path") from None
    except ValueError:
        raise _usage(f"--bench {path}: not JSON", remedy="give the output of `inferctl bench --json` or --out") from None
    return guard(bench_throughput, doc, path)


def cost(
    scenario_name: Annotated[
        str, typer.Option("--scenario", "-s", help=f"all, {', '.join(SCENARIOS)}.")
    ] = "all",
    pool: Annotated[list[str] | None, typer.Option("--pool", help=_POOL_HELP)] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model preset (roofline estimate).")] = None,
    prompt_tokens: Annotated[int | None, typer.Option("--prompt-tokens", help="Prompt tokens per request.")] = None,
    output_tokens: Annotated[int | None, typer.Option("--output-tokens", help="Output tokens per request.")] = None,
    cache_hit_rate: Annotated[
        float | None, typer.Option("--cache-hit-rate", help="Cached / prompt tokens (radix cache).")
    ] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="Decode sequences per replica.")] = None,
    spec_alpha: Annotated[float | None, typer.Option("--spec-alpha", help="Speculative acceptance rate.")] = None,
    spec_gamma: Annotated[int | None, typer.Option("--spec-gamma", help="Draft tokens per step.")] = None,
    spec_cost_ratio: Annotated[float | None, typer.Option("--spec-cost-ratio", help="Draft / target step.")] = None,
    no_spec: Annotated[bool, typer.Option("--no-spec", help="Turn speculative decoding off.")] = False,
    prefill_mfu: Annotated[float | None, typer.Option("--prefill-mfu", help="Prefill achieved / peak FLOPs.")] = None,
    decode_efficiency: Annotated[
        float | None, typer.Option("--decode-efficiency", help="Decode achieved / roofline tokens/s.")
    ] = None,
    utilisation: Annotated[
        float | None, typer.Option("--utilisation", help="Share of paid hours serving, in (0, 1].")
    ] = None,
    cached_price_ratio: Annotated[
        float | None, typer.Option("--cached-price-ratio", help="Cached input token price / uncached, [0, 1].")
    ] = None,
    weight_dtype: Annotated[str | None, typer.Option("--weight-dtype", help="Weight dtype.")] = None,
    kv_dtype: Annotated[str | None, typer.Option("--kv-dtype", help="KV cache dtype.")] = None,
    mem_fraction: Annotated[float | None, typer.Option("--mem-fraction", help="SGLang --mem-fraction-static.")] = None,
    bench: Annotated[
        str | None, typer.Option("--bench", help="Measured throughput: a `bench --json` (or --out) file.")
    ] = None,
    input_tps: Annotated[float | None, typer.Option("--input-tps", help="Given prompt tokens/s.")] = None,
    output_tps: Annotated[float | None, typer.Option("--output-tps", help="Given output tokens/s.")] = None,
    prefill_share: Annotated[
        float | None, typer.Option("--prefill-share", help="Collocated: share of GPU time in prefill.")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", envvar=PROFILE_ENV, show_envvar=False, help="Pools from this profile's nodes (prices via --pool; default: $INFERCTL_PROFILE).")
    ] = None,
    json: JsonOpt = False,
) -> None:
    """Cost per million input (cached discounted) and output tokens, per deployment scenario."""
    sess = session(json)
    if profile and scenario_name not in ("all", "profile"):
        raise _usage("--profile builds its own scenario: leave out --scenario", remedy="e.g. -p prod.yaml")
    if profile:
        scenario_name = "profile"
    names = _PRESETS if scenario_name == "all" else [scenario_name]
    if scenario_name == "all" and (bench or output_tps is not None or input_tps is not None):
        raise _usage("a measured or given throughput belongs to one deployment: give --scenario too",
                     remedy=f"e.g. --scenario disaggregated (one of {', '.join(SCENARIOS)})")
    pools = [parse_pool(p) for p in pool or []]
    prof = get_profile(profile) if profile else None
    measured = read_bench(bench) if bench else None
    given: dict[str, Any] = {
        "model": model, "prefill_mfu": prefill_mfu, "decode_bw_efficiency": decode_efficiency,
        "utilisation": utilisation, "cached_price_ratio": cached_price_ratio, "weight_dtype": weight_dtype,
        "kv_dtype": kv_dtype, "mem_fraction": mem_fraction}
    out: CostOutcome = guard(cost_outcome, CostRequest(
        scenarios=names, strict_pools=scenario_name != "all", pools=pools,
        profile=_deployment(prof) if prof else None, measured=measured, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, cache_hit_rate=cache_hit_rate, batch=batch, given=given,
        spec_alpha=spec_alpha, spec_gamma=spec_gamma, spec_cost_ratio=spec_cost_ratio, no_spec=no_spec,
        input_tps=input_tps, output_tps=output_tps, prefill_share=prefill_share))
    report = Report("plan cost", prof.name if prof else None, data=out.data)
    finish(sess, report, lambda c: _render(c, out.rows))


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:,.4f}" if v < 1 else f"${v:,.2f}"


def _render(console: Console, rows: list[tuple[Scenario, Throughput, CostPlan]]) -> None:
    t = Table("", *[s.name for s, _, _ in rows], title="cost per million tokens")
    def line(label: str, cells: list[str]) -> None:
        t.add_row(label, *cells)
    line("pools", ["\n".join(f"{p.role}: {p.nodes} x {p.gpus_per_node} {p.accelerator} @ {_money(p.node_hour_usd)}"
                             f"/node-h, tp {p.tp}" for p in s.pools) for s, _, _ in rows])
    line("model", [s.model or "-" for s, _, _ in rows])
    line("prompt / output tokens", [f"{s.workload.prompt_tokens:,} / {s.workload.output_tokens:,}" for s, _, _ in rows])
    line("decode batch per replica", [f"{tp.decode_batch or s.workload.batch}" for s, tp, _ in rows])
    line("speculative (alpha, gamma, c)", [
        "off" if s.spec is None else f"{s.spec.alpha:g}, {s.spec.gamma}, {s.spec.cost_ratio:g}" for s, _, _ in rows])
    line("cache hit rate", [f"{tp.cache_hit_rate:.1%}" for _, tp, _ in rows])
    line("prefill MFU / decode efficiency", [f"{s.prefill_mfu:g} / {s.decode_bw_efficiency:g}" for s, _, _ in rows])
    line("utilisation", [f"{s.utilisation:.0%}" for s, _, _ in rows])
    line("cached price ratio", [f"{s.cached_price_ratio:g}" for s, _, _ in rows])
    line("throughput source", [tp.source for _, tp, _ in rows])
    line("input / output tokens/s", [f"{tp.input_tokens_s:,.0f} / {tp.output_tokens_s:,.0f}" for _, tp, _ in rows])
    line("bottleneck / prefill share", [
        tp.bottleneck or ("-" if tp.prefill_share is None else f"prefill {tp.prefill_share:.1%} of GPU time")
        for _, tp, _ in rows])
    line("$ per hour (prefill / decode)", [
        f"{_money(c.hourly_usd)} ({_money(c.prefill_hourly_usd)} / {_money(c.decode_hourly_usd)})"
        for _, _, c in rows])
    line("$/M input (uncached)", [_money(c.usd_per_m_input) for _, _, c in rows])
    line("$/M cached input", [_money(c.usd_per_m_cached_input) for _, _, c in rows])
    line("$/M output", [_money(c.usd_per_m_output) for _, _, c in rows])
    line("$/M output, all-in", [_money(c.usd_per_m_output_all_in) for _, _, c in rows])
    console.print(t)
