"""`inferctl plan cost`: $ per million input / cached / output tokens for deployment scenarios
(collocated, disaggregated, disaggregated + speculative + radix cache), every input printed and overridable."""

from __future__ import annotations

import json as jsonlib
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.cli.common import PROFILE_ENV, JsonOpt, finish, get_profile, session
from infer_ctl.cli.plan_common import guard
from infer_ctl.core.report import Report
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.cost import (
    ROLES,
    SCENARIOS,
    CostPlan,
    Pool,
    Scenario,
    Speculative,
    Throughput,
    check_scenario,
    estimate_throughput,
    node_hour_price,
    plan_cost,
    scenario,
    with_workload,
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


def _apply_pool(pool: Pool | None, role: str, fields: dict[str, Any]) -> Pool:
    base = pool or Pool(role, nodes=1, gpus_per_node=8, node_hour_usd=0.0)
    changes: dict[str, Any] = {}
    if "nodes" in fields:
        changes["nodes"] = fields["nodes"]
    if "gpus" in fields:
        changes["gpus_per_node"] = fields["gpus"]
    if "accelerator" in fields:
        changes["accelerator"] = fields["accelerator"]
    if "tp" in fields:
        changes["tp"] = fields["tp"]
    out = replace(base, **changes)
    if "node_hour" in fields:
        out = replace(out, node_hour_usd=fields["node_hour"])
    elif "gpu_hour" in fields:
        if fields["gpu_hour"] < 0:
            raise _usage(f"--pool {role}:gpu_hour (cost per GPU-hour) must be >= 0, got {fields['gpu_hour']:g}")
        out = replace(out, node_hour_usd=node_hour_price(gpus_per_node=out.gpus_per_node,
                                                         gpu_hour_usd=fields["gpu_hour"]))
    elif pool is None:
        raise _usage(f"--pool {role}: a new pool needs its price: node_hour=USD or gpu_hour=USD")
    return out


def _with_pools(s: Scenario, pools: list[tuple[str, dict[str, Any]]], *, strict: bool) -> Scenario:
    current = list(s.pools)
    for role, fields in pools:
        idx = next((i for i, p in enumerate(current) if p.role == role), None)
        if idx is None and not strict and s.name != "custom":
            continue  # `--scenario all`: a decode override does not apply to the collocated scenario
        if idx is None:
            current.append(_apply_pool(None, role, fields))
        else:
            current[idx] = _apply_pool(current[idx], role, fields)
    return replace(s, pools=tuple(current))


def profile_scenario(prof: Profile, priced: set[str]) -> Scenario:
    """The pools of a profile (nodes per role, GPUs per node, the `gpu` label as accelerator, the target
    model's preset and tp); prices are not in a profile, so every role needs a --pool price."""
    groups: dict[tuple[str, int, str], int] = {}
    for node in prof.nodes:
        if prof.collocated:
            role = "collocated"
        elif len(node.roles) == 1:
            role = str(node.roles[0])
        else:
            raise _usage(f"profile {prof.name}: node {node.name} has roles {', '.join(map(str, node.roles))} "
                         "but the profile is not collocated", remedy="give the deployment with --pool instead")
        label = node.labels.get("gpu", "h100-sxm")
        accel = label if label in presets.ACCELERATORS else "h100-sxm"
        key = (role, node.gpus, accel)
        groups[key] = groups.get(key, 0) + 1
    unpriced = sorted({role for role, _, _ in groups} - priced)
    if unpriced:
        raise _usage(f"profile {prof.name} has no prices: give --pool ROLE:node_hour=USD (or gpu_hour=USD) for "
                     f"{', '.join(unpriced)}", remedy=f"e.g. --pool {unpriced[0]}:gpu_hour=2.5")
    target = prof.models.target if prof.models else None
    tp = target.tp if target else 8
    pools = tuple(Pool(role, nodes=n, gpus_per_node=gpus, node_hour_usd=0.0, accelerator=accel, tp=tp)
                  for (role, gpus, accel), n in groups.items())
    return Scenario(f"profile:{prof.name}", prof.description or f"the nodes of profile {prof.name}", pools=pools,
                    model=target.preset if target else None)


def read_bench(path: str) -> Throughput:
    """A `bench --json` document or a `bench --out` file: both carry the summary."""
    try:
        doc = jsonlib.loads(Path(path).read_text())
    except OSError as exc:
        raise _usage(f"--bench {path}: cannot read it ({exc.strerror or exc})", remedy="check the path") from None
    except ValueError:
        raise _usage(f"--bench {path}: not JSON", remedy="give the output of `inferctl bench --json` or --out") from None
    summary = doc.get("summary") if isinstance(doc, dict) else None
    keys = ("input_token_throughput", "output_token_throughput")
    if not isinstance(summary, dict) or not all(isinstance(summary.get(k), int | float) for k in keys):
        raise _usage(f"--bench {path}: no summary.input_token_throughput / output_token_throughput",
                     remedy="give the output of `inferctl bench --json` or the file of `bench --out`")
    hit = summary.get("cache_hit_rate", 0.0)
    return Throughput(float(summary["input_token_throughput"]), float(summary["output_token_throughput"]),
                      float(hit) if isinstance(hit, int | float) else 0.0, f"bench {path}")


def _throughput(s: Scenario, bench: Throughput | None, input_tps: float | None, output_tps: float | None,
                prefill_share: float | None) -> Throughput:
    if bench is not None:
        measured = bench
    elif output_tps is not None:
        if output_tps <= 0:
            raise _usage(f"--output-tps must be > 0, got {output_tps:g}")
        if input_tps is not None and input_tps < 0:
            raise _usage(f"--input-tps must be >= 0, got {input_tps:g}")
        measured = Throughput(input_tps or 0.0, output_tps, s.workload.cache_hit_rate, "given")
    elif input_tps is not None:
        raise _usage("--input-tps needs --output-tps", remedy="e.g. --input-tps 20000 --output-tps 2000")
    else:
        if s.model is None:
            raise _usage("no throughput source: give --bench FILE, --output-tps N, or --model PRESET "
                         "(roofline estimate)", remedy="e.g. --model llama-3.1-70b")
        return _share(guard(estimate_throughput, s), prefill_share)
    if s.layout == "collocated" and prefill_share is None and s.model is not None:
        # the measured token rates, split by the roofline's time per prefill / per decode token
        est = guard(estimate_throughput, with_workload(s, cache_hit_rate=min(measured.cache_hit_rate, 0.999)))
        assert est.prefill_seconds_per_request is not None and est.decode_tokens_s_per_replica is not None
        pre = measured.input_tokens_s / s.workload.prompt_tokens * est.prefill_seconds_per_request
        dec = measured.output_tokens_s / est.decode_tokens_s_per_replica
        measured = replace(measured, prefill_share=pre / (pre + dec) if pre + dec else None)
    return _share(measured, prefill_share)


def _share(tp: Throughput, prefill_share: float | None) -> Throughput:
    if prefill_share is None:
        return tp
    if not 0 <= prefill_share <= 1:
        raise _usage(f"--prefill-share must be in [0, 1], got {prefill_share:g}")
    return replace(tp, prefill_share=prefill_share)


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
    rows = []
    for name in names:
        if prof is not None:
            priced = {role for role, f in pools if "node_hour" in f or "gpu_hour" in f}
            s = profile_scenario(prof, priced)
            s = _with_pools(s, pools, strict=True)
        else:
            s = guard(scenario, name)
            s = _with_pools(s, pools, strict=scenario_name != "all")
        s = with_workload(s, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                          cache_hit_rate=cache_hit_rate, batch=batch)
        given: dict[str, Any] = {
            "model": model, "prefill_mfu": prefill_mfu, "decode_bw_efficiency": decode_efficiency,
            "utilisation": utilisation, "cached_price_ratio": cached_price_ratio, "weight_dtype": weight_dtype,
            "kv_dtype": kv_dtype, "mem_fraction": mem_fraction}
        s = replace(s, **{k: v for k, v in given.items() if v is not None})
        s = _with_spec(s, spec_alpha, spec_gamma, spec_cost_ratio, no_spec)
        guard(check_scenario, s)
        tp = _throughput(s, measured, input_tps, output_tps, prefill_share)
        rows.append((s, tp, guard(plan_cost, s, tp)))
    report = Report("plan cost", prof.name if prof else None, data={"scenarios": [_doc(s, tp, c) for s, tp, c in rows]})
    finish(sess, report, lambda c: _render(c, rows))


def _with_spec(s: Scenario, alpha: float | None, gamma: int | None, ratio: float | None, off: bool) -> Scenario:
    if off:
        return replace(s, spec=None)
    if alpha is None and gamma is None and ratio is None:
        return s
    base = s.spec or Speculative(alpha=0.7, gamma=3, cost_ratio=0.05)
    spec = Speculative(alpha=base.alpha if alpha is None else alpha, gamma=base.gamma if gamma is None else gamma,
                       cost_ratio=base.cost_ratio if ratio is None else ratio)
    return replace(s, spec=spec)


def _doc(s: Scenario, tp: Throughput, c: CostPlan) -> dict[str, Any]:
    inputs = asdict(s)
    inputs["layout"] = s.layout
    for p, d in zip(s.pools, inputs["pools"], strict=True):
        d |= {"gpus": p.gpus, "hourly_usd": p.hourly_usd, "replicas": p.replicas}
    return {"name": s.name, "description": s.description, "inputs": inputs, "throughput": asdict(tp),
            "cost": asdict(c)}


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
