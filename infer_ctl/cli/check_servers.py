"""`inferctl check servers`: health and drift of the SGLang servers (registers itself on `check`)."""

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
from infer_ctl.core.report import Report
from infer_ctl.output.table import render_findings_report


@app.command("servers")
def check_servers_cmd(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
) -> None:
    """Every instance healthy; /server_info matches the profile (drift); P and D agree; each decode
    reaches each prefill's bootstrap port; no stuck queues. Exit 0/1/2/3."""
    from infer_ctl.checks.servers import check_servers  # imported here so `--help` stays fast

    sess, prof = session(json_out), get_profile(profile)
    chosen, fleet = open_fleet(
        prof, select, role, parallel=parallel, accept_new_host_keys=accept_new_host_keys
    )
    with fleet:
        findings = check_servers(prof, fleet, chosen)
    report = Report("check servers", prof.name, findings=findings)
    finish(sess, report, lambda console: render_findings_report(console, report))
