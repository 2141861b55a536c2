"""`inferctl check servers`: health and drift of the SGLang servers (registers itself on `check`)."""

from __future__ import annotations

from infer_ctl.checks.servers import check_servers
from infer_ctl.cli.check_cmd import app
from infer_ctl.cli.common import JsonOpt, NodesOpt, ProfileOpt, RoleOpt, finish, get_profile, session
from infer_ctl.core.report import Report
from infer_ctl.output.table import render_findings_report
from infer_ctl.remote.fleet import Fleet, select_nodes


@app.command("servers")
def check_servers_cmd(
    profile: ProfileOpt = None, json_out: JsonOpt = False, select: NodesOpt = None, role: RoleOpt = None
) -> None:
    """Every instance healthy; /server_info matches the profile (drift); P and D agree; each decode
    reaches each prefill's bootstrap port; no stuck queues. Exit 0/1/2/3."""
    sess, prof = session(json_out), get_profile(profile)
    chosen = select_nodes(prof, select, role)
    with Fleet(prof) as fleet:
        findings = check_servers(prof, fleet, chosen)
    report = Report("check servers", prof.name, findings=findings)
    finish(sess, report, lambda console: render_findings_report(console, report))
