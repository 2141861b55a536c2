"""`inferctl check fabric [--pingpong]`: RDMA/RoCE configuration of the selected nodes and, with
--pingpong, pair tests shown as a prefill x decode matrix (registers itself on the `check` group)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

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
    status_line,
)
from infer_ctl.core.findings import Status
from infer_ctl.core.report import Report
from infer_ctl.output.table import STATUS_STYLE, render_findings_report

PingpongOpt = Annotated[bool, typer.Option("--pingpong", help="Also run ibv_rc_pingpong (+ perftest) between node pairs.")]
GdrOpt = Annotated[bool, typer.Option("--gdr", help="Also run ib_write_bw --use_cuda (GPUDirect RDMA) between the node pairs (fabric.gdr).")]
NcclOpt = Annotated[bool, typer.Option("--nccl", help="Also run nccl-tests all_reduce_perf over the selected nodes (fabric.nccl).")]
PairsOpt = Annotated[
    str | None, typer.Option("--pairs", help="prefill-decode (default), mesh, or explicit (fabric.pingpong.explicit_pairs).")
]


@app.command("fabric")
def check_fabric_cmd(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    pingpong: PingpongOpt = False,
    pairs: PairsOpt = None,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
    gdr: GdrOpt = False,
    nccl: NcclOpt = False,
) -> None:
    """Devices, link state/rate, GID choice, MTU, PFC/trust/ECN, global pause, counters. Exit 0/1/2/3."""
    from infer_ctl.checks.fabric import check_fabric  # imported here so `--help` stays fast

    sess, prof = session(json_out), get_profile(profile)
    chosen, fleet = open_fleet(prof, select, role, parallel=parallel, accept_new_host_keys=accept_new_host_keys)
    extra: dict[str, Any] = {}
    with fleet, \
            status_line(sess, "checking the fabric" + (" and running pair tests" if pingpong else "")):
        result = check_fabric(prof, fleet, chosen, pingpong=pingpong, pair_mode=pairs)
        if gdr or nccl:  # active diagnostics (checks/diag.py): after the configuration they depend on
            from infer_ctl.checks.diag import run_gdr, run_nccl
            from infer_ctl.core.fabric.expectations import expectations

            if gdr:
                found, extra["gdr"] = run_gdr(prof, fleet, chosen, result.facts,
                                              {n.name: expectations(prof, n) for n in chosen}, pair_mode=pairs)
                result.findings += found
            if nccl:
                result.findings += run_nccl(prof, fleet, chosen)
    report = Report("check fabric", prof.name, findings=result.findings,
                    data={**({"pairs": result.pairs} if pingpong else {}), **extra})
    finish(sess, report, lambda console: render_fabric(console, report, result.pairs, extra.get("gdr")))


def render_fabric(console: Console, report: Report, pairs: dict[str, Any], gdr: dict[str, Any] | None = None) -> None:
    render_findings_report(console, report, show_ok=False)
    if pairs.get("cells"):
        console.print(pair_table(pairs))
    if gdr and gdr.get("cells"):
        console.print(pair_table(gdr))


def pair_table(pairs: dict[str, Any]) -> Table:
    """Rows: servers (prefill nodes by default), columns: clients (decode nodes); worst round trip per cell."""
    table = Table(title=f"pair tests ({pairs['mode']}: {', '.join(pairs['tools'])})", header_style="bold")
    table.add_column("server \\ client")
    for col in pairs["columns"]:
        table.add_column(col, justify="right")
    cells = {(c["server"], c["client"]): c for c in pairs["cells"]}
    for row in pairs["rows"]:
        rendered = []
        for col in pairs["columns"]:
            c = cells.get((row, col))
            rendered.append("" if c is None else f"[{STATUS_STYLE[Status(c['status'])]}]{c['text']}[/]")
        table.add_row(row, *rendered)
    return table
