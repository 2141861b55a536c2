"""`inferctl exec -- COMMAND...`: run one command on every selected node.

The fleet (paramiko) and the profile models are imported inside the command, so `inferctl exec --help`
does not pay for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

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
from infer_ctl.errors import UsageError
from infer_ctl.output.terminal_text import safe_cell, terminal_safe
from infer_ctl.remote.base import Command

if TYPE_CHECKING:
    from infer_ctl.profile import Node
    from infer_ctl.remote.base import CommandResult, Connector

_PREVIEW_LINES = 3


def exec_(
    command: Annotated[
        list[str],
        typer.Argument(
            help="The command. One argument is a shell snippet (sh -c); several are an argv, quoted for you.",
            show_default=False,
        ),
    ],
    profile: ProfileOpt = None,
    json_out: JsonOpt = False,
    select: NodesOpt = None,
    role: RoleOpt = None,
    sudo: Annotated[
        bool, typer.Option("--sudo", help="Run through sudo -n (or ssh.sudo_password_env).")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds per node (default ssh.command_timeout_s).")
    ] = None,
    parallel: ParallelOpt = None,
    fail_fast: Annotated[
        bool, typer.Option("--fail-fast", help="Start no more nodes after the first failure.")
    ] = False,
    accept_new_host_keys: AcceptNewHostKeysOpt = False,
) -> None:
    """Run COMMAND on every selected node. Exit 0 all returned 0, 2 any failed, 3 any unreachable (none failed)."""
    from infer_ctl.core.report import Report
    from infer_ctl.output.progress import fanout_progress
    from infer_ctl.remote.outcomes import command_failed, exec_exit_code, exec_result

    sess = session(json_out)
    prof = get_profile(profile)
    cmd = to_command(command)
    if timeout is not None and timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {timeout:g}", remedy="e.g. --timeout 30")
    limit = timeout or prof.ssh.command_timeout_s
    chosen, fleet = open_fleet(prof, select, role, parallel=parallel, accept_new_host_keys=accept_new_host_keys)

    def run(conn: Connector, node: Node) -> CommandResult:
        return conn.run(cmd, timeout=limit, sudo=sudo)

    with (
        fleet,
        fanout_progress(sess.err, len(chosen), f"exec {cmd.shell()[:40]}", enabled=sess.progress) as on_done,
    ):
        outcomes = fleet.map(chosen, run, fail_fast=fail_fast, progress=on_done, failed=command_failed)
    results = [exec_result(o, limit) for o in outcomes]
    report = Report(
        "exec",
        prof.name,
        results=results,
        exit_code_override=exec_exit_code(outcomes),
        data={"command_line": cmd.shell()},
    )
    finish(sess, report, lambda console: render_exec(console, results, sess.err))


def to_command(words: list[str]) -> Command:
    if not words or not any(w.strip() for w in words):
        raise UsageError("no command given", remedy="inferctl exec -- uname -r")
    return Command.sh(words[0]) if len(words) == 1 else Command(*words)


def _preview(text: str) -> str:
    # split on LF only: str.splitlines would also break at \r, \x1c.., which terminal_safe shows instead
    lines = terminal_safe(text).rstrip("\n").split("\n") if text.strip("\n") else []
    shown = "\n".join(escape(line[:200]) for line in lines[:_PREVIEW_LINES])
    return shown + (
        f"\n[dim]… {len(lines) - _PREVIEW_LINES} more lines[/dim]" if len(lines) > _PREVIEW_LINES else ""
    )


def render_exec(console: Console, results: list[dict[str, Any]], err: Console | None = None) -> None:
    if not console.is_terminal:  # piped: pdsh's `node: line`, identical outputs grouped (dshbak -c)
        from infer_ctl.output.grouped_lines import write_grouped

        def say(c: Console) -> Callable[[str], None]:
            return lambda line: c.out(line, highlight=False)

        write_grouped(results, say(console), say(err or console))
        return
    table = Table(header_style="bold")
    for col in ("node", "host", "exit", "time", "output"):
        table.add_column(col, overflow="fold")
    for r in results:
        code = "-" if r["exit_code"] is None else str(r["exit_code"])
        style = "green" if r["ok"] else "red"
        body = _preview(r["stdout"])
        if r["stderr"].strip():
            body += ("\n" if body else "") + f"[yellow]{_preview(r['stderr'])}[/yellow]"
        if r["error"]:
            body += ("\n" if body else "") + f"[red]{escape(terminal_safe(r['error']))}[/red]"
            if r.get("remedy"):
                body += f"\n  → {escape(terminal_safe(r['remedy']))}"
        table.add_row(
            safe_cell(r["node"], multiline=False),
            safe_cell(r["host"], multiline=False),
            f"[{style}]{code}[/{style}]",
            f"{r['duration_s']:.2f}s",
            body,
        )
    console.print(table)
    bad = sum(not r["ok"] for r in results)
    console.print(
        f"{len(results) - bad}/{len(results)} ok"
        + (f", [red]{bad} failed or unreachable[/red]" if bad else "")
    )
