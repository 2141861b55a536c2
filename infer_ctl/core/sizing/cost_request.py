"""`plan cost` from what it was given to its scenarios: presets (or a profile's pools) with the --pool
overrides, workload, model and speculative settings applied, a throughput (measured, given, or the
roofline estimate) and the cost of each. The CLI (cli/plan_cost.py) parses the options, reads the
profile and the bench file, calls `cost_outcome`, renders."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.cost import (
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
from infer_ctl.core.sizing.inputs import InputError

_HELP = "see `inferctl plan cost --help`"


def _input(message: str, remedy: str = _HELP) -> InputError:
    return InputError(message, remedy)


@dataclass(frozen=True)
class ProfileNode:
    name: str
    roles: tuple[str, ...]
    gpus: int
    gpu_label: str | None  # the node's `gpu` label


@dataclass(frozen=True)
class ProfileDeployment:
    """What plan cost reads of a profile: its nodes, and the target model's preset and tp."""

    name: str
    description: str | None
    collocated: bool
    nodes: tuple[ProfileNode, ...]
    model: str | None = None
    tp: int | None = None


@dataclass(frozen=True)
class CostRequest:
    """The options of `plan cost` (None: left out); `pools` as parse_pool gives them."""

    scenarios: list[str]
    strict_pools: bool  # one scenario named: a --pool for a role it lacks adds the pool
    pools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    profile: ProfileDeployment | None = None
    measured: Throughput | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cache_hit_rate: float | None = None
    batch: int | None = None
    given: dict[str, Any] = field(default_factory=dict)  # Scenario fields set by options
    spec_alpha: float | None = None
    spec_gamma: int | None = None
    spec_cost_ratio: float | None = None
    no_spec: bool = False
    input_tps: float | None = None
    output_tps: float | None = None
    prefill_share: float | None = None


@dataclass(frozen=True)
class CostOutcome:
    rows: list[tuple[Scenario, Throughput, CostPlan]]
    data: dict[str, Any]


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
            raise _input(f"--pool {role}:gpu_hour (cost per GPU-hour) must be >= 0, got {fields['gpu_hour']:g}")
        out = replace(out, node_hour_usd=node_hour_price(gpus_per_node=out.gpus_per_node,
                                                         gpu_hour_usd=fields["gpu_hour"]))
    elif pool is None:
        raise _input(f"--pool {role}: a new pool needs its price: node_hour=USD or gpu_hour=USD")
    return out


def with_pools(s: Scenario, pools: list[tuple[str, dict[str, Any]]], *, strict: bool) -> Scenario:
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


def profile_scenario(prof: ProfileDeployment, priced: set[str]) -> Scenario:
    """The pools of a profile (nodes per role, GPUs per node, the `gpu` label as accelerator, the target
    model's preset and tp); prices are not in a profile, so every role needs a --pool price."""
    groups: dict[tuple[str, int, str], int] = {}
    for node in prof.nodes:
        if prof.collocated:
            role = "collocated"
        elif len(node.roles) == 1:
            role = node.roles[0]
        else:
            raise _input(f"profile {prof.name}: node {node.name} has roles {', '.join(node.roles)} "
                         "but the profile is not collocated", remedy="give the deployment with --pool instead")
        label = node.gpu_label or "h100-sxm"
        accel = label if label in presets.ACCELERATORS else "h100-sxm"
        key = (role, node.gpus, accel)
        groups[key] = groups.get(key, 0) + 1
    unpriced = sorted({role for role, _, _ in groups} - priced)
    if unpriced:
        raise _input(f"profile {prof.name} has no prices: give --pool ROLE:node_hour=USD (or gpu_hour=USD) for "
                     f"{', '.join(unpriced)}", remedy=f"e.g. --pool {unpriced[0]}:gpu_hour=2.5")
    tp = prof.tp if prof.tp is not None else 8
    pools = tuple(Pool(role, nodes=n, gpus_per_node=gpus, node_hour_usd=0.0, accelerator=accel, tp=tp)
                  for (role, gpus, accel), n in groups.items())
    return Scenario(f"profile:{prof.name}", prof.description or f"the nodes of profile {prof.name}", pools=pools,
                    model=prof.model)


def bench_throughput(doc: Any, path: str) -> Throughput:
    """The measured rates of a `bench --json` document or a `bench --out` file: both carry the summary."""
    summary = doc.get("summary") if isinstance(doc, dict) else None
    keys = ("input_token_throughput", "output_token_throughput")
    if not isinstance(summary, dict) or not all(isinstance(summary.get(k), int | float) for k in keys):
        raise _input(f"--bench {path}: no summary.input_token_throughput / output_token_throughput",
                     remedy="give the output of `inferctl bench --json` or the file of `bench --out`")
    hit = summary.get("cache_hit_rate", 0.0)
    return Throughput(float(summary["input_token_throughput"]), float(summary["output_token_throughput"]),
                      float(hit) if isinstance(hit, int | float) else 0.0, f"bench {path}")


def _throughput(s: Scenario, r: CostRequest) -> Throughput:
    if r.measured is not None:
        measured = r.measured
    elif r.output_tps is not None:
        if r.output_tps <= 0:
            raise _input(f"--output-tps must be > 0, got {r.output_tps:g}")
        if r.input_tps is not None and r.input_tps < 0:
            raise _input(f"--input-tps must be >= 0, got {r.input_tps:g}")
        measured = Throughput(r.input_tps or 0.0, r.output_tps, s.workload.cache_hit_rate, "given")
    elif r.input_tps is not None:
        raise _input("--input-tps needs --output-tps", remedy="e.g. --input-tps 20000 --output-tps 2000")
    else:
        if s.model is None:
            raise _input("no throughput source: give --bench FILE, --output-tps N, or --model PRESET "
                         "(roofline estimate)", remedy="e.g. --model llama-3.1-70b")
        return _share(estimate_throughput(s), r.prefill_share)
    if s.layout == "collocated" and r.prefill_share is None and s.model is not None:
        # the measured token rates, split by the roofline's time per prefill / per decode token
        est = estimate_throughput(with_workload(s, cache_hit_rate=min(measured.cache_hit_rate, 0.999)))
        assert est.prefill_seconds_per_request is not None and est.decode_tokens_s_per_replica is not None
        pre = measured.input_tokens_s / s.workload.prompt_tokens * est.prefill_seconds_per_request
        dec = measured.output_tokens_s / est.decode_tokens_s_per_replica
        measured = replace(measured, prefill_share=pre / (pre + dec) if pre + dec else None)
    return _share(measured, r.prefill_share)


def _share(tp: Throughput, prefill_share: float | None) -> Throughput:
    if prefill_share is None:
        return tp
    if not 0 <= prefill_share <= 1:
        raise _input(f"--prefill-share must be in [0, 1], got {prefill_share:g}")
    return replace(tp, prefill_share=prefill_share)


def _with_spec(s: Scenario, r: CostRequest) -> Scenario:
    if r.no_spec:
        return replace(s, spec=None)
    alpha, gamma, ratio = r.spec_alpha, r.spec_gamma, r.spec_cost_ratio
    if alpha is None and gamma is None and ratio is None:
        return s
    base = s.spec or Speculative(alpha=0.7, gamma=3, cost_ratio=0.05)
    spec = Speculative(alpha=base.alpha if alpha is None else alpha, gamma=base.gamma if gamma is None else gamma,
                       cost_ratio=base.cost_ratio if ratio is None else ratio)
    return replace(s, spec=spec)


def scenario_doc(s: Scenario, tp: Throughput, c: CostPlan) -> dict[str, Any]:
    inputs = asdict(s)
    inputs["layout"] = s.layout
    for p, d in zip(s.pools, inputs["pools"], strict=True):
        d |= {"gpus": p.gpus, "hourly_usd": p.hourly_usd, "replicas": p.replicas}
    return {"name": s.name, "description": s.description, "inputs": inputs, "throughput": asdict(tp),
            "cost": asdict(c)}


def cost_outcome(r: CostRequest) -> CostOutcome:
    """Every scenario asked for, built, checked, its throughput found and costed; an impossible input
    raises ValueError (InputError: with its remedy)."""
    rows = []
    for name in r.scenarios:
        if r.profile is not None:
            priced = {role for role, f in r.pools if "node_hour" in f or "gpu_hour" in f}
            s = with_pools(profile_scenario(r.profile, priced), r.pools, strict=True)
        else:
            s = with_pools(scenario(name), r.pools, strict=r.strict_pools)
        s = with_workload(s, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                          cache_hit_rate=r.cache_hit_rate, batch=r.batch)
        s = replace(s, **{k: v for k, v in r.given.items() if v is not None})
        s = _with_spec(s, r)
        check_scenario(s)
        tp = _throughput(s, r)
        rows.append((s, tp, plan_cost(s, tp)))
    return CostOutcome(rows, {"scenarios": [scenario_doc(s, tp, c) for s, tp, c in rows]})
