"""`inferctl demo --scenario spec-drift`: rendering of the speculative-drift demo (infer_ctl/bench/spec_demo.py)."""

from __future__ import annotations

import logging

from rich import box
from rich.console import Console
from rich.table import Table

from infer_ctl.bench.spec_demo import CONTROLS, SpecDemoOptions, SpecDemoOutcome, run_spec_demo
from infer_ctl.cli.common import Session, finish, status_line
from infer_ctl.core.report import Report
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.profile import Profile


def spec_drift(sess: Session, prof: Profile, *, control: str, seed: int, json_: bool,
               profile_ref: str = "builtin:local") -> None:
    if control not in CONTROLS:
        raise UsageError(f"--control {control!r} is not a controller mode", remedy=f"use one of {', '.join(CONTROLS)}")
    # the embedded router logs its actions as warnings; the demo prints them itself
    logging.getLogger("infer_ctl.router").addHandler(logging.NullHandler())
    with status_line(sess, "running the spec-drift demo (simulated cluster + router + controller)"):
        outcome = run_spec_demo(prof, SpecDemoOptions(control=control, seed=seed, profile_ref=profile_ref),
                                log=lambda m: None if json_ else sess.err.print(f"[dim]demo: {m}[/dim]",
                                                                                 highlight=False))
    report = Report(command="demo", profile=prof.name, data={"scenario": "spec-drift", **outcome.as_dict()})
    report.exit_code_override = ExitCode.OK if outcome.failed_total == 0 else ExitCode.FAIL
    finish(sess, report, lambda console: render(console, outcome))


def render(console: Console, o: SpecDemoOutcome) -> None:
    pools = o.decodes
    t = Table(title=f"inferctl demo: spec-drift (control {o.control})", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("window", "decode", "alpha", "steps", "tok/s", "tok/target step"):
        t.add_column(col, justify="left" if col in ("window", "decode") else "right")
    for ph in o.phases:
        failed = f", {ph.failed} failed" if ph.failed else ""
        t.add_row(ph.name, f"all ({ph.ok} answers{failed})", "", "", f"{ph.throughput:,.0f}", "")
        for url, pool in pools.items():
            w = ph.acceptance.get(url, {})
            t.add_row("", pool, "-" if w.get("alpha") is None else f"{w['alpha']:.2f}", str(w.get("num_steps", "-")),
                      f"{ph.per_decode.get(url, 0):,.0f}", f"{ph.step_throughput.get(url, 0):.2f}")
    console.print(t)
    console.print("[dim]tok/s: model time; tok/target step: accept length / (1 + steps x c), the decode's "
                  "throughput relative to the target alone[/dim]")
    for ph in o.phases:
        for f in ph.findings:
            if f["status"] != "ok":
                console.print(f"check spec after '{ph.name}': {f['status'].upper()} {f['node']}: {f['message']}",
                              highlight=False, markup=False)
    for a in o.actions:
        console.print(f"controller {a['action']} pool {a['pool']}: {a.get('message', '')}", highlight=False, markup=False)
        if a.get("profile_change"):
            console.print(a["profile_change"].rstrip(), highlight=False, markup=False)
            console.print(f"apply with: {a['command']}", highlight=False, markup=False)
        if a.get("result"):
            console.print(f"  result: {a['result']['message']}", highlight=False, markup=False)
    if o.control == "act" and len(o.phases) == 3:
        before, after = o.phases[1], o.phases[2]
        changed = [u for u, p in pools.items() if any(a["pool"] == p and a["action"] == "relaunch" for a in o.actions)]
        for u in changed:
            console.print(f"{pools[u]}: tokens per target step {before.step_throughput.get(u, 0):.2f} -> "
                          f"{after.step_throughput.get(u, 0):.2f}; {before.per_decode.get(u, 0):,.0f} -> "
                          f"{after.per_decode.get(u, 0):,.0f} tok/s (model)", highlight=False)
        console.print(f"cluster throughput after / before the change: {o.speedup or 0:.2f}x; requests failed while "
                      f"the pool relaunched: {o.failed_during_change} of {o.ok_during_change + o.failed_during_change}; "
                      f"in the whole run: {o.failed_total}", highlight=False)
