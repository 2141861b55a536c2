"""`inferctl audit`: every check family, cron-friendly (JSON, textfile, history, exit codes).

The checks, the fleet (paramiko) and the profile models are imported inside the command, so
`inferctl audit --help` does not pay for them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infer_ctl.cli.common import (
    AcceptNewHostKeysOpt,
    JsonOpt,
    NodesOpt,
    ParallelOpt,
    ProfileOpt,
    RoleOpt,
    finish,
    get_profile,
    session,
)
from infer_ctl.cli.findings_view import AllOpt, render_problems
from infer_ctl.errors import UsageError


def audit_cmd(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    textfile: Annotated[Path | None, typer.Option("--textfile", help="Write a node_exporter *.prom file atomically.")] = None,
    history: Annotated[Path | None, typer.Option("--history", help="Append one JSON line per run to this file.")] = None,
    since_last: Annotated[bool, typer.Option("--since-last", help="Report only changes since the last run in --history.")] = False,
    only: Annotated[str | None, typer.Option("--only", help="Comma-separated families, e.g. gpu,fabric.")] = None,
    pingpong: Annotated[bool, typer.Option("--pingpong", help="Fabric family: also run the RDMA pair tests (fabric.pingpong).")] = False,
    remediate: Annotated[bool, typer.Option("--remediate", help="Drain nodes whose findings say so from the router, return them after clean audits (profile remediation:, needs --history).")] = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    show_all: AllOpt = False,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
) -> None:
    """Run all check families. Exit 0 ok, 1 warn, 2 fail, 3 unknown (the whole run, also with --since-last)."""
    from infer_ctl.checks.audit import AuditOptions, audit
    from infer_ctl.checks.registry import families
    from infer_ctl.profile.select import select_nodes

    sess, prof = session(json_out), get_profile(profile)
    wanted = {name.strip() for name in only.split(",") if name.strip()} if only is not None else None
    if wanted is not None and not wanted:
        raise UsageError(f"--only {only!r} names no check family", remedy="e.g. --only gpu,fabric")
    chosen_families = families(wanted)
    opts = AuditOptions(only=wanted, textfile=textfile, history=history, since_last=since_last,
                        accept_new_host_keys=accept_new_host_keys, parallel=parallel, pingpong=pingpong,
                        remediate=remediate)
    report = audit(prof, select_nodes(prof, select, role), chosen_families, opts)
    finish(sess, report, lambda console: render_problems(console, report, show_all=show_all))
