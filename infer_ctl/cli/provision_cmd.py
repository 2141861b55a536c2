"""`inferctl provision`: make nodes ready (drivers reported, venv, units, limits, sysctls, QoS).

`--plan` (the default) only probes; `--apply` shows the plan, asks (unless --yes), applies it, verifies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from infer_ctl.cli.common import JsonOpt, NodesOpt, ProfileOpt, RoleOpt, finish, get_profile, session
from infer_ctl.core.report import Report
from infer_ctl.exitcodes import ExitCode
from infer_ctl.provision import workflow as support
from infer_ctl.provision.plan_table import render_plans
from infer_ctl.provision.steps.registry import all_steps
from infer_ctl.provision.wheelhouse import build_lock, build_wheelhouse

app = typer.Typer(help="Provision nodes: plan (default) or apply host changes, idempotently.")
wheelhouse_app = typer.Typer(help="Offline wheelhouses for air-gapped installs.", no_args_is_help=True)
app.add_typer(wheelhouse_app, name="wheelhouse")


@app.callback(invoke_without_command=True)
def provision(
    ctx: typer.Context,
    plan: Annotated[bool, typer.Option("--plan", help="Probe and print the plan; change nothing (default).")] = False,
    apply: Annotated[bool, typer.Option("--apply", help="Apply the plan's CHANGE steps, then verify.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking.")] = False,
    skip: Annotated[str | None, typer.Option("--skip", help="Comma-separated steps to skip.")] = None,
    only: Annotated[str | None, typer.Option("--only", help="Run only these steps.")] = None,
    wheelhouse: Annotated[Path | None, typer.Option("--wheelhouse", help="Offline wheelhouse directory.")] = None,
    hugepages: Annotated[int | None, typer.Option("--hugepages", help="vm.nr_hugepages (Mooncake Store only).")] = None,
    restart: Annotated[bool, typer.Option("--restart", help="try-restart units whose unit/env changed.")] = False,
    keep_backups: Annotated[int | None, typer.Option("--keep-backups", help="Backups kept per managed file (default 5).")] = None,
    rolling: Annotated[int | None, typer.Option("--rolling", help="Apply to N nodes at a time.")] = None,
    fail_fast: Annotated[bool, typer.Option("--fail-fast", help="Stop the fleet at the first failed node.")] = False,
    parallel: Annotated[int | None, typer.Option("--parallel", help="Nodes in parallel (default ssh.parallelism).")] = None,
    no_diff: Annotated[bool, typer.Option("--no-diff", help="Do not print file diffs.")] = False,
    profile: ProfileOpt = None, nodes: NodesOpt = None, role: RoleOpt = None, json: JsonOpt = False,
) -> None:
    """Exit 0: nothing to change; 1: changes pending; 2: errors; 3: nodes unreachable."""
    if ctx.invoked_subcommand is not None:
        return
    if plan and apply:
        raise typer.BadParameter("give --plan or --apply, not both")
    sess, prof = session(json), get_profile(profile)
    options = support.make_options(skip, only, wheelhouse, hugepages, restart, keep_backups)
    if apply and not yes:
        support.require_interactive(json)

    def confirm(fleet_plan: support.FleetPlan) -> bool:
        render_plans(sess.out, fleet_plan.plans, title="plan", show_diff=not no_diff)
        return typer.confirm(f"Apply {fleet_plan.changes} change(s)?", default=False)

    plans = support.run_provision(prof, nodes=nodes, role=role, options=options, apply=apply, yes=yes,
                                  rolling=rolling, fail_fast=fail_fast, parallel=parallel, confirm=confirm)
    report = support.provision_report("provision", prof, plans, apply=apply)
    finish(sess, report, lambda c: render_plans(c, plans, title="apply" if apply else "plan", show_diff=not no_diff))


@app.command("steps")
def steps(json: JsonOpt = False) -> None:
    """List the provisioning steps in the order they run."""
    sess = session(json)
    rows = [{"step": s.name, "needs_root": s.needs_sudo, "what": s.title} for s in all_steps()]
    table = Table("step", "root", "what", title="provisioning steps")
    for r in rows:
        table.add_row(str(r["step"]), "yes" if r["needs_root"] else "no", str(r["what"]))
    finish(sess, Report("provision steps", None, data={"steps": rows}), lambda c: c.print(table))


@app.command("rollback")
def rollback_cmd(profile: ProfileOpt = None, nodes: NodesOpt = None, role: RoleOpt = None,
                 parallel: Annotated[int | None, typer.Option("--parallel")] = None, json: JsonOpt = False) -> None:
    """Point <venvs>/current back at the previous SGLang venv (one atomic rename per node)."""
    sess, prof = session(json), get_profile(profile)
    results = support.run_rollback(prof, nodes, role, parallel)
    code = max((int(r.get("exit_code", 0) or 0) for r in results), default=0)  # type: ignore[call-overload]
    report = Report("provision rollback", prof.name, results=results, exit_code_override=ExitCode(code))
    lines = [f"{r['node']}: current -> {r['to']} (was {r['from']})" if r["state"] == "applied"
             else f"{r['node']}: error: {r['error']}" for r in results]
    lines.append("units start <venvs>/<sglang.version>: set sglang.version back and apply with --restart "
                 "(docs/runbooks/provision.md)")
    finish(sess, report, lambda c: c.print("\n".join(lines)))


@app.command("lock")
def lock_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="The lockfile to write (then set sglang.lock_file).")],
    requirement: Annotated[list[str] | None, typer.Option("--requirement", help="A requirement (repeatable).")] = None,
    pip_arg: Annotated[list[str] | None, typer.Option("--pip-arg", help="Extra pip argument (repeatable): the nodes' "
                       "platform, e.g. --pip-arg=--platform=manylinux_2_28_x86_64 --pip-arg=--python-version=3.12.")] = None,
    profile: ProfileOpt = None, json: JsonOpt = False,
) -> None:
    """Resolve SGLang and its whole dependency set once (pip, nothing installed) into a lockfile every node installs."""
    sess = session(json)
    reqs = requirement or [f"sglang=={get_profile(profile).sglang.version}"]
    lock = build_lock(out, reqs, pip_args=pip_arg or [])
    pins = len([line for line in lock.splitlines() if line.strip()])
    finish(sess, Report("provision lock", None, data={"path": str(out), "packages": pins}),
           lambda c: c.print(f"lock {out}: {pins} package(s) pinned by version and sha256; set sglang.lock_file: {out}"))


@wheelhouse_app.command("build")
def wheelhouse_build(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the wheelhouse into.")],
    requirement: Annotated[list[str] | None, typer.Option("--requirement", help="A requirement (repeatable).")] = None,
    pip_arg: Annotated[list[str] | None, typer.Option("--pip-arg", help="Extra pip download argument (repeatable), "
                       "e.g. --pip-arg=--platform=manylinux_2_28_x86_64 --pip-arg=--python-version=3.12.")] = None,
    lock: Annotated[Path | None, typer.Option("--lock", help="Download exactly this lockfile's files "
                    "(`provision lock`); it becomes the wheelhouse's requirements.lock.")] = None,
    profile: ProfileOpt = None, json: JsonOpt = False,
) -> None:
    """On a connected machine: download, pin (version + sha256) and manifest every wheel."""
    sess = session(json)
    reqs = [] if lock is not None and not requirement else requirement or [f"sglang=={get_profile(profile).sglang.version}"]
    wh = build_wheelhouse(out, reqs, pip_args=pip_arg or [], lock_file=lock)
    data = {"path": str(out), "files": len(wh.manifest.files), "lock_sha256": wh.manifest.lock_sha256}
    finish(sess, Report("provision wheelhouse build", None, data=data),
           lambda c: c.print(f"wheelhouse {out}: {data['files']} wheel(s), lock sha256 {wh.manifest.lock_sha256[:12]}"))
