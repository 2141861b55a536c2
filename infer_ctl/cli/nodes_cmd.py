"""`inferctl nodes`: can I reach every node? (connect, auth, sudo, OS, kernel, python3, uptime)

The fleet (paramiko) and the profile models are imported inside the command, so `inferctl nodes --help`
does not pay for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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
from infer_ctl.output.terminal_text import safe_cell, terminal_safe

if TYPE_CHECKING:
    from rich.console import Console

    from infer_ctl.profile import Node
    from infer_ctl.remote.base import Connector
    from infer_ctl.remote.fleet import NodeOutcome
    from infer_ctl.remote.probe import NodeInfo


def nodes(
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    parallel: ParallelOpt = None,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
) -> None:
    """Reachability of every node: connect, auth, sudo, OS, kernel, python3, uptime. Exit 3 if any is unreachable."""
    from infer_ctl.core.report import Report
    from infer_ctl.exitcodes import ExitCode
    from infer_ctl.output.progress import fanout_progress
    from infer_ctl.remote.outcomes import combine_exit_codes
    from infer_ctl.remote.probe import probe_node

    sess = session(json_out)
    prof = get_profile(profile)
    chosen, fleet = open_fleet(prof, select, role, parallel=parallel, accept_new_host_keys=accept_new_host_keys)
    with fleet:

        def probe(conn: Connector, node: Node) -> NodeInfo:
            return probe_node(
                conn, node, sudo_enabled=prof.ssh.sudo, connect_s=fleet.connect_seconds(node) or 0.0
            )

        with fanout_progress(sess.err, len(chosen), "probing nodes", enabled=sess.progress) as on_done:
            outcomes = fleet.map(chosen, probe, progress=on_done)
    infos = [_info(o) for o in outcomes]
    codes = [ExitCode.OK if o.error is None else int(o.error.exit_code) for o in outcomes]
    report = Report(
        "nodes", prof.name, results=[i.to_dict() for i in infos], exit_code_override=combine_exit_codes(codes)
    )
    finish(sess, report, lambda console: render_nodes(console, infos))


def _info(outcome: NodeOutcome[NodeInfo]) -> NodeInfo:
    from infer_ctl.remote.probe import NodeInfo

    if outcome.value is not None:
        return outcome.value
    err = outcome.error
    return NodeInfo(
        outcome.node.name,
        outcome.node.host,
        False,
        error=err.message if err else "unknown error",
        remedy=err.remedy if err else None,
    )


def render_nodes(console: Console, infos: list[NodeInfo]) -> None:
    # On a narrow terminal (or a pipe: 80 columns) only the essential columns are shown, so none of them
    # breaks into slivers; `--json` always has every field.
    wide = console.width >= 120
    cols = ["node", "host", "reach", "connect", "sudo", "python3", "kernel"]
    if wide:
        cols[4:4] = ["user"]
        cols += ["os", "uptime"]
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)
    for col in cols:
        if col == "sudo":
            table.add_column(col, overflow="fold", min_width=10)
        else:
            table.add_column(
                col, no_wrap=True, overflow="ellipsis", max_width=24 if col in ("os", "kernel") else None
            )
    for i in infos:
        values: dict[str, str | Text]
        # everything but our own markup is text from the profile or the node: safe_cell (no control
        # sequences reach the terminal, no `[...]` is read as markup)
        if not i.reachable:
            values = {
                "node": safe_cell(i.node, multiline=False),
                "host": safe_cell(i.host, multiline=False),
                "reach": "[red]no[/red]",
                "sudo": "[red]see below[/red]",
            }
        else:
            values = {
                "node": safe_cell(i.node, multiline=False),
                "host": safe_cell(i.host, multiline=False),
                "reach": "[green]yes[/green]",
                "connect": f"{i.connect_s:.2f}s",
                "user": safe_cell(i.user or "?", multiline=False),
                "sudo": safe_cell(i.sudo or "?", multiline=False),
                "python3": safe_cell(i.python3, multiline=False) if i.python3 else "[yellow]missing[/yellow]",
                "kernel": safe_cell(i.kernel or "?", multiline=False),
                "os": safe_cell(i.os or "?", multiline=False),
                "uptime": f"{i.uptime_s / 86400:.1f}d" if i.uptime_s is not None else "?",
            }
        table.add_row(*(values.get(col, "") for col in cols))
    console.print(table)
    for i in infos:
        if not i.reachable:
            # host key and jump host errors name the host, not the node: always lead with the node
            error = i.error or "unknown error"
            if not error.startswith(f"{i.node}:"):
                error = f"{i.node}: {error}"
            remedy = f"\n  → {escape(terminal_safe(i.remedy))}" if i.remedy else ""
            console.print(f"[red]{escape(terminal_safe(error))}[/red]" + remedy)
    down = sum(not i.reachable for i in infos)
    console.print(
        f"{len(infos) - down}/{len(infos)} reachable" + (f", [red]{down} unreachable[/red]" if down else "")
    )
