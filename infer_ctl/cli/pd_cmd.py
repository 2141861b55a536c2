"""`inferctl pd control`: the prefill:decode balance controller (docs/pd-control.md).

With `pd.control: advise` it says which server would move between the pools and why; with `act` it moves
it (SGLang's runtime role switch, servers launched with `sglang.pd_role_switch: true`) and records it.
`--once` runs one round (cron); otherwise it loops every `--interval` seconds."""

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
    RouterUrlOpt,
    finish,
    finish_controller,
    get_profile,
    router_base_url,
    session,
)
from infer_ctl.core.report import Report
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode

app = typer.Typer(help="Prefill:decode disaggregation in operation: the pool balance controller.",
                  no_args_is_help=True)


def _render(console: Console, records: list[dict[str, Any]]) -> None:
    for r in records:
        who = f" {r['server']}" if r.get("server") else ""
        move = f" ({r['from_role']} -> {r['to_role']})" if r.get("server") and r.get("to_role") else ""
        console.print(f"[bold]{r['action']}[/bold]{who}{move}: {r.get('reason', '')}", highlight=False)
        if r.get("finding"):
            f = r["finding"]
            console.print(f"  finding: {f['worker']}: {f['message']}"
                          + ("  (restart required; not retried until it is restarted)" if f.get("restart_required") else ""),
                          markup=False, highlight=False)
        elif r.get("result"):
            console.print(f"  result: {r['result']['message']}", markup=False, highlight=False)


@app.command("control")
def control(
    profile: ProfileOpt = None,
    url: RouterUrlOpt = None,
    once: Annotated[bool, typer.Option("--once", help="One round, then exit (for cron).")] = False,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between rounds.")] = 5.0,
    history: Annotated[Path | None, typer.Option("--history", help="Append every decision to this file (JSON lines).")] = None,
    advise: Annotated[bool, typer.Option("--advise", help="Only advise, whatever pd.control says.")] = False,
    state: Annotated[Path | None, typer.Option("--state", help="Controller state file (default: the state directory).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Watch the pools' TTFT and ITL at the router; move one server between prefill and decode when the mix
    stays shifted (pd.control). Exit 0 nothing to do, 1 advice given or a server moved, 2 a switch failed or
    was refused (or the state file or its lock cannot be used), 3 the router is unreachable or no round ran
    because another controller holds the lock (--json: `skipped` names the lock and its holder). The loop
    outlives the router: a round that cannot reach it is said and the next one runs; at the stop the exit
    is 3 if some round could not reach it and none failed (--json: `unreachable`). A server whose rebuild
    failed (`fatal`) is not switched again until it is seen restarted: down at the router, then healthy and
    undrained (or `pd clear-fatal`). The default state file is one per profile name and router URL."""
    from infer_ctl.launch.control_loop import StopAfterRound
    from infer_ctl.launch.pd_control import PdControlLoop, default_state_path, legacy_state_path
    from infer_ctl.launch.pd_switch import RoleSwitcher
    from infer_ctl.launch.router_hook import router_url
    from infer_ctl.router.control.client import AdminClient

    sess, prof = session(json_out), get_profile(profile)
    mode = "advise" if advise else prof.pd.control
    if mode == "off":
        raise UsageError("pd.control is off: the controller has nothing to do",
                         remedy="set pd.control: advise (or act, with sglang.pd_role_switch: true) in the profile, "
                                "or pass --advise")
    if not 0 < interval < math.inf:  # NaN too: the loop's sleep raised on it after the first round
        raise UsageError(f"--interval must be a finite number > 0, got {interval:g}", remedy="e.g. --interval 5")
    url = router_base_url(url) or router_url(prof)
    client = AdminClient(url, prof.router.admin_token_env, timeout=max(10.0, prof.pd.drain_timeout_s + 5))
    hc = prof.sglang.hicache
    switcher = RoleSwitcher(client, decode_cuda_graph_memory_gb=prof.pd.decode_cuda_graph_memory_gb,
                            drain_timeout_s=prof.pd.drain_timeout_s,
                            admin_key_env=hc.admin_api_key_env if hc is not None else None) if mode == "act" else None
    loop = PdControlLoop(prof, router_url=url, mode=mode, switcher=switcher, history=history,
                         state_path=state or default_state_path(prof, url),
                         legacy_state=None if state else legacy_state_path(prof), client=client,
                         say=lambda m: None if json_out else sess.err.print(f"[dim]pd control: {escape(m)}[/dim]"))
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
    acted = [r for r in records if r["action"] in ("advise", "switch", "cover", "restore", "failed", "refused")]
    code = (ExitCode.FAIL if any(r["action"] in ("failed", "refused") for r in records) else
            ExitCode.WARN if acted else ExitCode.OK)
    finish_controller(sess, "pd control", prof.name, {"mode": mode, "actions": records}, code, loop,
                      lambda c: _render(c, records) if once else None)


@app.command("clear-fatal")
def clear_fatal(
    urls: Annotated[list[str] | None, typer.Argument(help="The servers' URLs, as the router lists them.")] = None,
    profile: ProfileOpt = None,
    all_: Annotated[bool, typer.Option("--all-fatal", help="Every server marked fatal.")] = False,
    state: Annotated[Path | None, typer.Option("--state", help="Controller state file (default: the state directory).")] = None,
    url: Annotated[str | None, typer.Option(
        "--url", show_default=False,
        help="The router URL `pd control` was given with --url: its default state file is per router "
             "(default: the profile's router.listen).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Let `pd control` switch servers again whose rebuild failed (`fatal`), after you restarted them. The
    controller clears one by itself when it sees the restart (down at the router, then healthy and undrained);
    this is for a restart it did not see. Exit 0 cleared, 1 a URL named was not fatal, 2 the state file
    or its lock cannot be used, 3 another controller held the lock for 30 s (its round did not end)."""
    from infer_ctl.launch.control_loop import skip_line
    from infer_ctl.launch.pd_control import PdControlLoop, default_state_path, legacy_state_path
    from infer_ctl.launch.router_hook import router_url

    sess, prof = session(json_out), get_profile(profile)
    if bool(urls) == all_:
        raise UsageError("name the servers to clear, or pass --all-fatal", remedy="e.g. inferctl pd clear-fatal http://10.0.0.11:30000")
    base = router_base_url(url) or router_url(prof)
    loop = PdControlLoop(prof, router_url=base, mode="advise", state_path=state or default_state_path(prof, base),
                         legacy_state=None if state else legacy_state_path(prof))
    # as the router spells a worker (router/control/admin_http.py norm_url): `10.0.0.11:30000/` named the
    # fatal http://10.0.0.11:30000 and was answered "not fatal", exit 1, leaving it fatal
    named = [(router_base_url(u.strip()) or "").rstrip("/") for u in urls or []]
    got = loop.clear_fatal(None if all_ else named)
    if got is None:
        skip = loop.last_skip or {}
        finish(sess, Report("pd clear-fatal", prof.name, data={"cleared": [], "skipped": skip},
                            exit_code_override=ExitCode.UNKNOWN),
               lambda c: c.print(skip_line(skip), markup=False, highlight=False))
    cleared, not_fatal = got
    report = Report("pd clear-fatal", prof.name, data={"cleared": cleared, "not_fatal": not_fatal,
                                                       "fatal": loop.state.fatal},
                    exit_code_override=ExitCode.WARN if not_fatal else ExitCode.OK)

    def render(c: Console) -> None:
        for u in cleared:
            c.print(f"cleared {u}: pd control may switch it again", markup=False, highlight=False)
        for u in not_fatal:
            c.print(f"{u} is not fatal: nothing to clear", markup=False, highlight=False)
        if not cleared and not not_fatal:
            c.print("no fatal server", markup=False, highlight=False)

    finish(sess, report, render)
