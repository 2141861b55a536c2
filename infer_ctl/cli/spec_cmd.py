"""`inferctl spec control`: the speculative-decoding controller (docs/speculative.md, "The controller").

With `speculative.control: advise` it prints, per pool that needs it, the exact profile change and the
one command that applies it; with `act` it applies the change itself (a rolling relaunch of that pool
only) and records it. `--once` runs one round (cron); otherwise it loops every `--interval` seconds."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from infer_ctl.cli.common import (
    JsonOpt,
    ProfileOpt,
    RouterUrlOldOpt,
    finish_controller,
    get_profile,
    router_base_url,
    session,
)
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode

app = typer.Typer(help="Speculative decoding in operation: the acceptance controller.", no_args_is_help=True)


def _render(console: Console, records: list[dict[str, Any]]) -> None:
    for r in records:
        console.print(f"[bold]{r['action']}[/bold] pool {r['pool']}: {r.get('message', '')}", highlight=False)
        if r.get("profile_change"):
            console.print(r["profile_change"].rstrip(), markup=False, highlight=False)
        if r.get("command"):
            console.print(f"apply with: {r['command']}", markup=False, highlight=False)
        if r.get("result"):
            console.print(f"  result: {r['result']['message']}", markup=False, highlight=False)


@app.command("control")
def control(
    profile: ProfileOpt = None,
    router: RouterUrlOldOpt = None,
    once: Annotated[bool, typer.Option("--once", help="One round, then exit (for cron).")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between rounds.")] = 30.0,
    history: Annotated[Path | None, typer.Option("--history", help="Append every action to this audit history (JSON lines).")] = None,
    advise: Annotated[bool, typer.Option("--advise", help="Only advise, whatever speculative.control says.")] = False,
    state: Annotated[Path | None, typer.Option("--state", help="Controller state file (default: the state directory).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch the router's acceptance per decode pool; advise or act (speculative.control). Exit 0 nothing to
    do, 1 advice given or a pool changed, 2 a relaunch failed (or the state file or its lock cannot be used),
    3 the router is unreachable or no round ran because another controller holds the lock (--json: `skipped`
    names the lock and its holder). The loop outlives the router: a round that cannot reach it is said and
    the next one runs; at the stop the exit is 3 if some round could not reach it and none failed (--json:
    `unreachable`). The default state file is one per profile name and router URL."""
    from infer_ctl.launch.control_loop import StopAfterRound
    from infer_ctl.launch.router_hook import router_url
    from infer_ctl.launch.spec_control import SpecControlLoop, default_state_path, legacy_state_path
    from infer_ctl.launch.spec_relaunch import SshRelauncher

    sess, prof = session(json_out), get_profile(profile)
    mode = "advise" if advise else prof.speculative.control
    if mode == "off":
        raise UsageError("speculative.control is off: the controller has nothing to do",
                         remedy="set speculative.control: advise (or act) in the profile, or pass --advise")
    if not 0 < interval < math.inf:  # NaN too: the loop's sleep raised on it after the first round
        raise UsageError(f"--interval must be a finite number > 0, got {interval:g}", remedy="e.g. --interval 30")
    actuator = SshRelauncher(prof, console=None if json_out else sess.err) if mode == "act" else None
    url = router_base_url(router) or router_url(prof)
    loop = SpecControlLoop(prof, router_url=url, mode=mode, actuator=actuator,
                           history=history, profile_ref=profile or "PROFILE",
                           state_path=state or default_state_path(prof, url),
                           legacy_state=None if state else legacy_state_path(prof),
                           say=lambda m: None if json_out else sess.err.print(f"[dim]spec control: {escape(m)}[/dim]"))
    records: list[dict[str, Any]] = []

    def show(batch: list[dict[str, Any]]) -> None:
        records.extend(batch)
        if not json_out and not once:
            _render(sess.out, batch)

    # a signal lets the round end (a switch cut half way leaves its server drained, unrecorded)
    with StopAfterRound(loop.say).installed() as stopping:
        try:
            loop.run(interval, rounds=1 if once else None, stop=stopping.stop, on_records=show, outlive=not once)
        except KeyboardInterrupt:  # the second signal
            if once:
                raise
    code = (ExitCode.FAIL if any(r["action"] == "failed" for r in records) else
            ExitCode.WARN if records else ExitCode.OK)
    decisions = list(loop.last_round.values())
    finish_controller(sess, "spec control", prof.name, {"mode": mode, "actions": records, "pools": decisions},
                      code, loop, lambda c: _render_round(c, records, decisions, mode) if once else None)


def _render_round(console: Console, records: list[dict[str, Any]], decisions: list[dict[str, Any]],
                  mode: str) -> None:
    """--once: the actions, then every pool's decision, "no change" included (it printed nothing)."""
    _render(console, records)
    for d in decisions:
        alpha = "alpha unknown" if d.get("alpha") is None else f"alpha {d['alpha']:.2f}"
        console.print(f"pool {d['pool']}: {d['decision']} ({alpha} over {d.get('requests', 0)} requests)",
                      markup=False, highlight=False)
    if not decisions:
        console.print(f"no change ({mode}): the router reported no decode pool with speculative statistics",
                      markup=False, highlight=False)
