"""`inferctl check gpu`: GPU health of the selected nodes (registers itself on the `check` group).

The checks, the fleet (paramiko) and the profile models are imported inside the command, so
`inferctl check gpu --help` does not pay for them."""

from __future__ import annotations

from infer_ctl.cli.check_cmd import app
from infer_ctl.cli.common import (
    AcceptNewHostKeysOpt,
    JsonOpt,
    NodesOpt,
    ParallelOpt,
    ProfileOpt,
    RoleOpt,
    finish,
    get_profile,
    open_fleet,
    session,
)
from infer_ctl.cli.findings_view import AllOpt, render_problems


@app.command("gpu")
def check_gpu_cmd(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    show_all: AllOpt = False,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
) -> None:
    """Driver, count, ECC, row remap, XIDs, temperature, throttling, PCIe, NVLink, MIG. Exit 0/1/2/3.

    The table lists only findings that are not OK (--all lists every one); --json has all of them."""
    from infer_ctl.checks.gpu import check_gpu
    from infer_ctl.core.report import Report

    sess, prof = session(json_out), get_profile(profile)
    chosen, fleet = open_fleet(prof, select, role, parallel=parallel, accept_new_host_keys=accept_new_host_keys)
    with fleet:
        findings = check_gpu(fleet, chosen, prof)
    report = Report("check gpu", prof.name, findings=findings)
    finish(sess, report, lambda console: render_problems(console, report, show_all=show_all))
