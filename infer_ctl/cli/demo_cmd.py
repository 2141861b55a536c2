"""`inferctl demo`: a simulated PD cluster from the local profile, a router, a short bench, a table."""

from __future__ import annotations

from typing import Annotated

import typer

from infer_ctl.bench.demo import ROUTERS, DemoOptions, run_demo
from infer_ctl.bench.report import render
from infer_ctl.cli.common import PROFILE_ENV, JsonOpt, finish, get_profile, session, status_line
from infer_ctl.core.report import Report
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode


def demo(
    profile: Annotated[str, typer.Option("--profile", "-p", envvar=PROFILE_ENV, show_envvar=False, help="Profile whose cluster is simulated (default: $INFERCTL_PROFILE, else builtin:local).")] = "builtin:local",
    requests: Annotated[int, typer.Option("--requests", help="Requests in the bench.")] = 160,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Requests in flight.")] = 16,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Wall s per model s (0.5 = twice as fast).")] = 1.0,
    front: Annotated[str, typer.Option("--front", help=f"What fronts the workers: {', '.join(ROUTERS)} (was --router, which now always means a router's URL).")] = "auto",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the workload and the workers.")] = 0,
    scenario: Annotated[str, typer.Option("--scenario", help="shared-prefix (the bench), spec-drift (speculative acceptance, alert, controller) or pd-shift (the prefill:decode balance controller).")] = "shared-prefix",
    control: Annotated[str, typer.Option("--control", help="spec-drift: the controller's mode, off, advise or act; pd-shift: act or off.")] = "act",
    json_: JsonOpt = False,
) -> None:
    """Start the profile's cluster as simulated SGLang workers, route a shared-prefix bench through the
    router, print the results and shut everything down. `--scenario spec-drift`: the workload's domain
    shifts mid-run; shows alpha falling, the alert, the recommendation and (control act) the relaunch of
    the drifted pool and the recovered throughput."""
    sess = session(json_)
    # checked before anything starts: --requests 0 started the cluster and router, then failed inside
    for flag, value in (("--requests", requests), ("--concurrency", concurrency)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}", remedy="see `inferctl demo --help`")
    if not time_scale > 0 or time_scale == float("inf"):
        raise UsageError(f"--time-scale must be a number > 0, got {time_scale}", remedy="e.g. --time-scale 0.5")
    prof = get_profile(profile)
    if scenario == "spec-drift":
        from infer_ctl.cli.demo_spec import spec_drift

        spec_drift(sess, prof, control=control, seed=seed, json_=json_, profile_ref=profile)
        return
    if scenario == "pd-shift":
        from infer_ctl.cli.demo_pd import pd_shift

        pd_shift(sess, control=control, seed=seed, json_=json_)
        return
    if scenario != "shared-prefix":
        raise UsageError(f"unknown scenario {scenario!r}", remedy="use shared-prefix, spec-drift or pd-shift")
    opts = DemoOptions(requests=requests, concurrency=concurrency, time_scale=time_scale, router=front, seed=seed)
    with status_line(sess, "running the demo (simulated cluster + router + bench)"):
        outcome = run_demo(prof, opts, log=lambda m: sess.err.print(f"[dim]demo: {m}[/dim]") if not json_ else None)
    s = outcome.summary
    report = Report(command="demo", profile=prof.name,
                    data={"router": outcome.router, "router_url": outcome.router_url, "workers": outcome.workers,
                          "summary": s})
    report.exit_code_override = ExitCode.OK if s["failed"] == 0 else ExitCode.WARN if s["completed"] else ExitCode.FAIL
    finish(sess, report, lambda console: render(console, s, f"inferctl demo: {outcome.router}, {len(outcome.workers)} "
                                                           f"simulated workers ({prof.name})"))
