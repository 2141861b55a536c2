"""`inferctl plan pd`: the prefill:decode split of a GPU budget with the most goodput per GPU, and
whether collocated serving would do as well, with the arithmetic (core/sizing/pd.py)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.cli.common import JsonOpt, ProfileOpt, finish, get_profile, session
from infer_ctl.cli.plan_common import finite_options, guard, positive_options
from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.report import Report
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.pd import (
    Evaluation,
    Hardware,
    Link,
    PdInputs,
    PdPlan,
    RequestClass,
    plan_pd,
    spread_classes,
)
from infer_ctl.core.sizing.pd_steps import explain
from infer_ctl.errors import UsageError

if TYPE_CHECKING:
    from infer_ctl.profile import Profile

_ASSUMPTIONS = (
    "Poisson arrivals, spread evenly over the servers of a pool",
    "a prefill server runs one prompt at a time (compute-bound: batching prompts adds no FLOP/s)",
    "M/G/1 waiting time with an exponential tail (exact for M/M/1)",
    "the decode batch is its steady-state mean (Little's law); every request sees its step time as ITL",
    "collocated: waiting prefills run before the next decode step (SGLang's order); the decode batch gets "
    "the time prefill leaves (chunked prefill spreads it, the mean stays); no transfer",
    "the KV transfer does not overlap the prefill and NICs are not shared between servers",
    "no prefix cache hits, no speculative decoding, no retraction; prefill MFU and decode efficiency are inputs",
)


def _usage(message: str, remedy: str = "see `inferctl plan pd --help`") -> UsageError:
    return UsageError(message, remedy=remedy)


def parse_class(spec: str) -> RequestClass:
    parts = spec.split(":")
    try:
        if len(parts) not in (2, 3):
            raise ValueError
        weight = float(parts[2]) if len(parts) == 3 else 1.0
        return RequestClass(int(parts[0]), int(parts[1]), weight)
    except ValueError:
        raise _usage(f"--class {spec!r}: expected IN:OUT or IN:OUT:WEIGHT", remedy="e.g. --class 4096:512:0.2") from None


def profile_inputs(prof: Profile) -> dict[str, Any]:
    """What a profile says about plan pd's inputs: the model, GPUs, each role's hardware, the fabric."""
    target = prof.models.target if prof.models else None
    tp = target.tp if target else 8
    hw: dict[str, Hardware] = {}
    for node in prof.nodes:
        label = node.labels.get("gpu", "h100-sxm")
        accel = label if label in presets.ACCELERATORS else "h100-sxm"
        for role in map(str, node.roles):
            hw.setdefault(role, Hardware(accel, min(tp, node.gpus)))
    default = next(iter(hw.values()), Hardware(tp=tp))
    devices = max((len(n.rdma.devices) for n in prof.nodes if n.rdma), default=0)
    out: dict[str, Any] = {"gpus": sum(n.gpus for n in prof.nodes), "prefill": hw.get("prefill", default),
                           "decode": hw.get("decode", default)}
    if target and target.preset:
        out["model"] = target.preset
    if prof.fabric.rate_gbps:
        out["link"] = Link(prof.fabric.rate_gbps, max(devices, 1))
    return out


def _hardware(base: Hardware, accel: str | None, tp: int | None) -> Hardware:
    return Hardware(accel if accel is not None else base.accelerator, tp if tp is not None else base.tp)


def pd(
    rate: Annotated[float, typer.Option("--rate", help="Arrival rate, requests/s (Poisson).")],
    ttft_ms: Annotated[float, typer.Option("--ttft-ms", help="TTFT objective, ms.")] = 1000.0,
    itl_ms: Annotated[float, typer.Option("--itl-ms", help="ITL (time per output token) objective, ms.")] = 50.0,
    input_tokens: Annotated[int, typer.Option("--input-tokens", help="Mean prompt tokens.")] = 4096,
    input_spread: Annotated[int, typer.Option("--input-spread", help="Std of prompt tokens (0: all equal).")] = 0,
    output_tokens: Annotated[int, typer.Option("--output-tokens", help="Mean output tokens.")] = 512,
    output_spread: Annotated[int, typer.Option("--output-spread", help="Std of output tokens.")] = 0,
    classes: Annotated[list[str] | None, typer.Option(
        "--class", help="A request class IN:OUT[:WEIGHT] (repeatable; replaces the means and spreads).")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="GPUs to split (default: the profile's, else 8).")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Model preset.")] = None,
    accelerator: Annotated[str | None, typer.Option("--accelerator", help="Both pools' accelerator preset.")] = None,
    prefill_accelerator: Annotated[str | None, typer.Option("--prefill-accelerator")] = None,
    decode_accelerator: Annotated[str | None, typer.Option("--decode-accelerator")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="GPUs per server, both pools.")] = None,
    prefill_tp: Annotated[int | None, typer.Option("--prefill-tp")] = None,
    decode_tp: Annotated[int | None, typer.Option("--decode-tp")] = None,
    bandwidth_gbps: Annotated[float | None, typer.Option("--bandwidth-gbps", help="Per NIC (default 400).")] = None,
    links: Annotated[int | None, typer.Option("--links", help="NICs a transfer stripes over (default 1).")] = None,
    latency_us: Annotated[float | None, typer.Option("--latency-us", help="Transfer latency (default 5).")] = None,
    prefill_mfu: Annotated[float, typer.Option("--prefill-mfu", help="Prefill achieved / peak FLOPs.")] = 0.5,
    decode_efficiency: Annotated[float, typer.Option("--decode-efficiency", help="Achieved / roofline.")] = 0.7,
    mem_fraction: Annotated[float, typer.Option("--mem-fraction", help="SGLang --mem-fraction-static.")] = 0.85,
    attainment: Annotated[float, typer.Option("--attainment", help="Share of requests the capacity keeps.")] = 0.9,
    # model, GPUs and the pools' hardware; $INFERCTL_PROFILE too, as in every command (issue 29 item 2)
    profile: ProfileOpt = None,
    json: JsonOpt = False,
) -> None:
    """The prefill:decode split with the most goodput per GPU, and whether collocated does as well."""
    sess = session(json)
    finite_options({"--rate": rate, "--ttft-ms": ttft_ms, "--itl-ms": itl_ms}, "plan pd")
    # before `prefill_tp or tp` below: 0 is falsy, so `--prefill-tp 0` fell back to --tp without a word
    positive_options(tp=tp, prefill_tp=prefill_tp, decode_tp=decode_tp)
    prof = get_profile(profile) if profile else None
    base: dict[str, Any] = profile_inputs(prof) if prof else {}
    link = base.get("link", Link())
    link = Link(bandwidth_gbps if bandwidth_gbps is not None else link.bandwidth_gbps,
                links if links is not None else link.links, latency_us if latency_us is not None else link.latency_us)
    req = tuple(parse_class(c) for c in classes) if classes else guard(
        spread_classes, input_tokens, input_spread, output_tokens, output_spread)
    inputs = PdInputs(
        classes=req, rate_rps=rate, ttft_slo_s=ttft_ms / 1e3, itl_slo_s=itl_ms / 1e3,
        gpus=gpus if gpus is not None else base.get("gpus", 8),
        prefill=_hardware(base.get("prefill", Hardware()), prefill_accelerator or accelerator, prefill_tp or tp),
        decode=_hardware(base.get("decode", Hardware()), decode_accelerator or accelerator, decode_tp or tp),
        model=model or base.get("model", "llama-3.1-70b"), link=link, prefill_mfu=prefill_mfu,
        decode_efficiency=decode_efficiency, mem_fraction=mem_fraction, attainment_target=attainment)
    plan: PdPlan = guard(plan_pd, inputs)
    report = Report("plan pd", prof.name if prof else None, data=_doc(plan))
    report.extend(_findings(plan))
    finish(sess, report, lambda c: _render(c, plan))


def _findings(plan: PdPlan) -> list[Finding]:
    best = max((e for e in (plan.best, plan.collocated) if e), key=lambda e: e.attainment)
    if best.attainment >= plan.inputs.attainment_target:
        return []
    return [Finding(check="plan.pd.attainment", node="local", status=Status.WARN, subject="--rate",
                    message=f"no layout of {plan.inputs.gpus} GPUs meets both objectives for "
                            f"{plan.inputs.attainment_target:.0%} of requests at {plan.inputs.rate_rps:g} req/s "
                            f"(best: {best.attainment:.1%})",
                    remedy="add GPUs, lower --rate or loosen --ttft-ms / --itl-ms")]


def _eval_doc(plan: PdPlan, e: Evaluation | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return asdict(e) | {"steps": list(explain(plan.inputs, e))}


def _doc(plan: PdPlan) -> dict[str, Any]:
    inputs = asdict(plan.inputs)
    return {"inputs": inputs, "answer": plan.answer, "reason": plan.reason, "gain_at_rate": plan.gain_at_rate,
            "gain_capacity": plan.gain_capacity, "best": _eval_doc(plan, plan.best),
            "collocated": _eval_doc(plan, plan.collocated),
            "splits": [{k: getattr(e, k) for k in ("prefill_servers", "decode_servers", "gpus", "attainment",
                                                    "goodput_per_gpu", "capacity_rps", "capacity_per_gpu", "itl_s",
                                                    "mean_ttft_s")} for e in plan.splits],
            "assumptions": list(_ASSUMPTIONS)}


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:,.1f}"


def _render(console: Console, plan: PdPlan) -> None:
    p = plan.inputs
    mix = ", ".join(f"{c.input_tokens:,}/{c.output_tokens:,}" for c in p.classes)
    console.print(f"{p.model}, {p.gpus} GPUs, {p.rate_rps:g} req/s of {mix} (in/out tokens); objectives TTFT "
                  f"{p.ttft_slo_s * 1e3:g} ms, ITL {p.itl_slo_s * 1e3:g} ms")
    t = Table("split", "GPUs", "attainment", "goodput/GPU", "capacity req/s", "mean TTFT ms", "ITL ms",
              title="prefill:decode splits (best first) and collocated")
    for e in (*plan.splits, plan.collocated):
        name = f"collocated x {e.prefill_servers}" if e.layout == "collocated" else \
            f"{e.prefill_servers}P:{e.decode_servers}D"
        t.add_row(name, str(e.gpus), f"{e.attainment:.1%}", f"{e.goodput_per_gpu:.4f}", f"{e.capacity_rps:.3f}",
                  _ms(e.mean_ttft_s), _ms(e.itl_s))
    console.print(t)
    console.print(f"[bold]{plan.answer}[/bold]: {plan.reason}")
    for title, shown in (("best split", plan.best), ("collocated", plan.collocated)):
        if shown is not None:
            console.print(f"\n[bold]{title}[/bold]")
            for line in explain(p, shown):
                console.print(f"  {line}", soft_wrap=True, markup=False)
    console.print("\nassumptions: " + "; ".join(_ASSUMPTIONS), soft_wrap=True, markup=False)
