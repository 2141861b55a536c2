"""`inferctl launch / status / stop / logs`: SGLang prefill/decode servers (bodies in launch/commands.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, TextIO

import typer

from infer_ctl.cli.common import JsonOpt, NodesOpt, ProfileOpt, finish, get_profile, session
from infer_ctl.launch import commands
from infer_ctl.output.table import render_findings_report
from infer_ctl.output.terminal_text import terminal_safe

RoleOpt = Annotated[
    str | None, typer.Option("--role", "-r", help="Only this role: prefill, decode or collocated.")
]
LockWaitOpt = Annotated[
    float,
    typer.Option(
        "--lock-wait",
        help="Seconds to wait for another launch/stop on the same nodes to finish (default: fail at once).",
    ),
]


def launch(
    profile: ProfileOpt = None,
    role: RoleOpt = None,
    nodes: NodesOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would run where; touch nothing.")
    ] = False,
    check_args: Annotated[
        bool,
        typer.Option("--check-args", help="Validate the arguments with SGLang's own parser; launch nothing."),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until every (re)started server is healthy.")
    ] = True,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Seconds to wait (default: the profile's).")
    ] = None,
    rolling: Annotated[
        bool,
        typer.Option(
            "--rolling",
            help="Restart every server, role by role (prefills, then decodes), a few at a time, each out of "
            "the router's pool until healthy again; one of each role keeps serving.",
        ),
    ] = False,
    max_unavailable: Annotated[
        int,
        typer.Option(
            "--max-unavailable", min=1,
            help="With --rolling: servers of one role restarted at once (capped so one keeps serving).",
        ),
    ] = 1,
    lock_wait: LockWaitOpt = 0.0,
    json: JsonOpt = False,
) -> None:
    """Start (or restart what changed of) the SGLang servers of the profile and wait until they are healthy."""
    sess = session(json)
    prof = get_profile(profile)
    if dry_run or check_args:
        if check_args:
            report = commands.check_args(prof, nodes, role)
            finish(sess, report, lambda c: render_findings_report(c, report))
        report = commands.dry_run(prof, nodes, role)
        finish(sess, report, lambda c: commands.render_dry_run(c, report))
    live = sess.err if sess.progress else None
    report = commands.launch(
        prof, nodes, role, wait=wait, timeout_s=timeout, rolling=rolling, console=live,
        max_unavailable=max_unavailable, lock_wait_s=lock_wait,
    )  # fmt: skip
    finish(sess, report, lambda c: commands.render_launch(c, report))


def status(
    profile: ProfileOpt = None, role: RoleOpt = None, nodes: NodesOpt = None, json: JsonOpt = False
) -> None:
    """Per instance: process state, health, model, PD mode, speculative algorithm, accept length, cache hits."""
    sess = session(json)
    report = commands.status(get_profile(profile), nodes, role)
    finish(sess, report, lambda c: commands.render_status(c, report))


def stop(
    profile: ProfileOpt = None,
    role: RoleOpt = None,
    nodes: NodesOpt = None,
    lock_wait: LockWaitOpt = 0.0,
    json: JsonOpt = False,
) -> None:
    """Stop servers gracefully (SIGTERM, then SIGKILL only after sglang.lifecycle.stop_timeout_s); decodes first."""
    sess = session(json)
    report = commands.stop(get_profile(profile), nodes, role, lock_wait_s=lock_wait)
    finish(sess, report, lambda c: commands.render_stop(c, report))


def logs(
    instance: Annotated[str, typer.Argument(help="Instance name (e.g. dc-01-decode) or a node running one.")],
    profile: ProfileOpt = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C stops).")
    ] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="journalctl --since value (systemd nodes).")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", help="How many last lines to show.")] = 100,
) -> None:
    """Print an instance's server log (journal or log file). To a terminal, control sequences in it are
    shown as escapes; piped or redirected, the log text is written exactly."""
    write = log_writer(sys.stdout)
    commands.logs(get_profile(profile), instance, lines=lines, since=since, follow=follow, write=write)


def log_writer(stream: TextIO) -> Callable[[str], None]:
    """How `logs` writes a node's log to `stream`. A log holds whatever the server (or anyone who can
    write to it) printed: to a terminal, an ESC[2J or OSC 52 in it would act on the operator's terminal,
    so it is made `terminal_safe`, with or without --follow. Anything else (a pipe, a file, grep) gets
    the exact text, the one way to keep its bytes."""
    exact = not stream.isatty()

    def write(text: str) -> None:
        stream.write(text if exact else terminal_safe(text))
        stream.flush()

    return write


def register(app: typer.Typer) -> None:
    app.command("launch")(launch)
    app.command("status")(status)
    app.command("stop")(stop)
    app.command("logs")(logs)
