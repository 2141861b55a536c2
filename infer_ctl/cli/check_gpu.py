"""`inferctl check gpu`: GPU health of the selected nodes (registers itself on the `check` group).

The checks, the fleet (paramiko) and the profile models are imported inside the command, so
`inferctl check gpu --help` does not pay for them."""

from __future__ import annotations

from typing import Annotated

import typer

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
    seconds_parser,
    session,
)
from infer_ctl.cli.findings_view import AllOpt, render_problems

#: --diag-timeout: NaN passed typer's min=1 check as "should be >= 1" and inf left the diagnostic unbounded
_diag_timeout = seconds_parser(1)


@app.command("gpu")
def check_gpu_cmd(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    show_all: AllOpt = False,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
    diag: Annotated[int | None, typer.Option("--diag", min=1, max=4, help="Also run DCGM's active diagnostic `dcgmi diag -r N -j` (1 quick, 2 medium, 3 long, 4 extended; loads the GPUs: drain them first).")] = None,
    diag_timeout: Annotated[float | None, typer.Option("--diag-timeout", parser=_diag_timeout, metavar="S", help="Seconds --diag may run per node (default by level: 300/900/3600/10800).")] = None,
) -> None:
    """Driver, count, ECC, row remap, XIDs, temperature, throttling, PCIe, NVLink, MIG. Exit 0/1/2/3.

    The table lists only findings that are not OK (--all lists every one); --json has all of them."""
    from infer_ctl.checks.gpu import check_gpu
    from infer_ctl.core.report import Report

    sess, prof = session(json_out), get_profile(profile)
    chosen, fleet = open_fleet(prof, select, role, parallel=parallel, accept_new_host_keys=accept_new_host_keys)
    with fleet:
        findings = check_gpu(fleet, chosen, prof)
        if diag is not None:
            from infer_ctl.checks.diag import run_dcgm

            findings += run_dcgm(fleet, chosen, diag, diag_timeout)
    report = Report("check gpu", prof.name, findings=findings)
    finish(sess, report, lambda console: render_problems(console, report, show_all=show_all))
