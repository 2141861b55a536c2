"""`inferctl check gpu`: GPU health of the selected nodes (registers itself on the `check` group)."""

from __future__ import annotations

from typing import Annotated

import typer

from infer_ctl.checks.gpu import check_gpu
from infer_ctl.cli.check_cmd import app
from infer_ctl.cli.common import JsonOpt, NodesOpt, ProfileOpt, RoleOpt, finish, get_profile, session
from infer_ctl.core.report import Report
from infer_ctl.output.table import render_findings_report
from infer_ctl.remote.fleet import Fleet, select_nodes

# The same options as `inferctl nodes`/`exec` (cli/nodes_cmd.py), so every fleet command reads alike.
ParallelOpt = Annotated[
    int | None, typer.Option("--parallel", help="At most N nodes at once (default ssh.parallelism).")
]
AcceptOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Record unknown host keys in inferctl's known_hosts (changed keys are always refused).",
    ),
]


@app.command("gpu")
def check_gpu_cmd(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptOpt = False,
) -> None:
    """Driver, count, ECC, row remap, XIDs, temperature, throttling, PCIe, NVLink, MIG. Exit 0/1/2/3."""
    sess, prof = session(json_out), get_profile(profile)
    chosen = select_nodes(prof, select, role)
    with Fleet(prof, accept_new_host_keys=accept_new_host_keys, parallel=parallel) as fleet:
        findings = check_gpu(fleet, chosen, prof)
    report = Report("check gpu", prof.name, findings=findings)
    finish(sess, report, lambda console: render_findings_report(console, report))
