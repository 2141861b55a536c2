"""Bodies of `inferctl launch / status / stop / logs`: build a Report from the profile and the fleet.
The typer layer (cli/launch_cmd.py) only parses options and renders."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from infer_ctl.core.findings import Finding
from infer_ctl.core.report import Report
from infer_ctl.core.sglang import (
    Instance,
    build_argv,
    env_file_path,
    find_instance,
    instances,
    unit_path,
)
from infer_ctl.core.sglang.consistency import launch_problems
from infer_ctl.core.sglang.kv_page import kv_page_findings
from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.launch import argcheck, lock, supervisor
from infer_ctl.launch import rolling as rolling_plan
from infer_ctl.launch.orchestrate import (
    Applied,
    Prepared,
    Readiness,
    prepare_node,
    refusal,
    select_instances,
    start_node,
    status_of,
    stop_node,
    stop_node_for_restart,
    wait_ready,
)
from infer_ctl.launch.render import render_env_file, render_unit
from infer_ctl.launch.router_hook import RouterNotifier
from infer_ctl.output.table import render_findings_report
from infer_ctl.output.terminal_text import safe_cell
from infer_ctl.profile import Node, Profile
from infer_ctl.profile.model_config import local_model_config
from infer_ctl.profile.select import select_nodes
from infer_ctl.remote.base import Connector
from infer_ctl.remote.fleet import Fleet


def _selection(profile: Profile, nodes: str | None, role: str | None) -> list[Instance]:
    if role and role not in ("prefill", "decode", "collocated"):
        raise UsageError(f"--role {role!r} is not a server role", remedy="use prefill, decode or collocated")
    node_role = role if role in ("prefill", "decode") else None
    insts = select_instances(profile, select_nodes(profile, nodes, node_role), role)
    if not insts:
        raise UsageError(
            "the selection runs no SGLang instance", remedy="check --nodes/--role against the profile"
        )
    return insts


# ---- launch --dry-run / --check-args ---------------------------------------------------------------
def dry_run(profile: Profile, nodes: str | None, role: str | None) -> Report:
    insts = _selection(profile, nodes, role)
    # + the KV page alignment warnings (core/sglang/kv_page.py), which do not block a launch
    findings = launch_problems(profile, insts) + kv_page_findings(profile, insts, config=local_model_config(profile))
    report = Report("launch", profile.name, findings=findings)
    report.results = [
        {
            "instance": i.name,
            "node": i.node,
            "host": i.host,
            "role": i.role,
            "url": i.url,
            "argv": build_argv(profile, i).argv,
            "env_file": {"path": env_file_path(i), "content": render_env_file(profile, i)},
            "unit": {"path": unit_path(i), "content": render_unit(profile, i)},
        }
        for i in insts
    ]
    report.data["dry_run"] = True
    return report


def render_dry_run(console: Console, report: Report) -> None:
    for r in report.results or []:
        console.print(f"[bold]{r['instance']}[/] on {r['node']} ({r['host']}), {r['role']} → {r['url']}")
        console.print(f"  env  {r['env_file']['path']}")
        for line in r["env_file"]["content"].splitlines():
            if not line.startswith("#"):
                console.print(f"       {line}", markup=False, highlight=False)
        console.print(f"  unit {r['unit']['path']}")
        console.print(f"  run  {shlex.join(r['argv'])}", markup=False, highlight=False, soft_wrap=True)
        console.print()
    if report.findings:
        render_findings_report(console, report, show_ok=False)


def check_args(profile: Profile, nodes: str | None, role: str | None) -> Report:
    insts = _selection(profile, nodes, role)
    report = Report("launch --check-args", profile.name, findings=launch_problems(profile, insts))
    if not argcheck.sglang_available():
        report.findings.append(
            Finding.unknown(
                "launch.sglang_parser",
                "-",
                "sglang",
                "SGLang is not importable here, so its own parser could not check the arguments "
                "(the flag table of SGLang 0.5.23 was still checked)",
                remedy="pip install 'torch==2.13.0+cpu' && pip install --no-deps sglang==0.5.23 && "
                "pip install 'inferctl[sglang]'",
            )
        )
        return report
    version = argcheck.sglang_version()
    wanted = profile.sglang.version
    for res in argcheck.check_instances([(i, build_argv(profile, i).argv) for i in insts]):
        hooks = f" and its resolution hooks ({', '.join(res.hooks)})" if res.hooks else ""
        if version != wanted:
            # another version's parser says nothing reliable about this one's flags: not "accepted"
            verdict = "accepts" if res.ok else f"rejects ({res.error})"
            report.findings.append(
                Finding.unknown(
                    "launch.sglang_parser",
                    res.node,
                    res.instance,
                    f"not checked: the SGLang here is {version or 'of unknown version'}, the profile runs "
                    f"{wanted} (SGLang {version}'s parser {verdict})",
                    details={"sglang_here": version, "sglang_profile": wanted, "parsed_ok": res.ok},
                    remedy=f"pip install --no-deps sglang=={wanted} on this machine, then rerun",
                )
            )
        elif res.ok and res.rewrites:
            # accepted, but what would run differs from what the profile says (the profile refuses rewrites)
            changed = "; ".join(f"{flag} {given} -> {resolved}" for flag, (given, resolved) in res.rewrites.items())
            report.findings.append(
                Finding.warn(
                    "launch.sglang_parser",
                    res.node,
                    res.instance,
                    f"accepted by SGLang {version}'s parser{hooks}, but its hooks rewrite {changed}",
                    details={"rewrites": {k: list(v) for k, v in res.rewrites.items()}},
                    remedy="set the value SGLang resolves to (see `launch.hicache`), so what runs is what the "
                    "profile says",
                )
            )
        elif res.ok:
            report.findings.append(
                Finding.ok(
                    "launch.sglang_parser", res.node, res.instance, f"accepted by SGLang {version}'s parser{hooks}"
                )
            )
        else:
            report.findings.append(
                Finding.fail(
                    "launch.sglang_parser",
                    res.node,
                    res.instance,
                    f"SGLang {version} rejects the arguments: {res.error}",
                    remedy="fix the flag in the profile's extra_args (see `inferctl launch --dry-run`)",
                )
            )
    return report


# ---- launch ------------------------------------------------------------------------------------------
def launch(
    profile: Profile,
    nodes: str | None,
    role: str | None,
    *,
    wait: bool,
    timeout_s: float | None,
    rolling: bool,
    console: Console | None,
    max_unavailable: int = 1,
    lock_wait_s: float = 0.0,
) -> Report:
    if max_unavailable < 1:
        raise UsageError(f"--max-unavailable must be at least 1, got {max_unavailable}",
                         remedy="e.g. --max-unavailable 2")  # fmt: skip
    every = instances(profile)
    # every rank of a server a selection touches: a rank restarted alone never rejoins its group
    insts = rolling_plan.whole_servers(_selection(profile, nodes, role), every)
    problems = launch_problems(profile, insts)
    report = Report("launch", profile.name, findings=list(problems))
    if any(f.status.value == "fail" for f in problems):
        report.data["launched"] = False
        return report  # refuse: a server with these arguments would fail minutes into loading
    timeout = timeout_s if timeout_s is not None else profile.sglang.lifecycle.start_timeout_s
    steps = rolling_plan.plan(insts, every, max_unavailable) if rolling else rolling_plan.at_once(insts)
    if rolling:
        report.data["rolling_steps"] = [[i.name for i in step.instances] for step in steps]
    applied: list[Applied] = []
    readiness: list[Readiness] = []
    notifier = RouterNotifier.for_profile(profile) if rolling else None
    router_notes: dict[str, str] = {}
    alone_notes: dict[str, str] = {}
    node_list = [profile.node(n) for n in dict.fromkeys(i.node for i in insts)]
    with Fleet(profile) as fleet, lock.holding(fleet, profile, node_list, "launch", wait_s=lock_wait_s) as taken:
        report.findings.extend(_lock_findings(taken))
        for step in steps:
            out = [s[0] for s in step.servers]
            if step.alone:
                # said, not warned: with one server of a role there is no restart without a pause
                alone_notes.update({i.name: f"the only {step.role} server: none served while it restarted"
                                    for i in out})  # fmt: skip
            settled, restart = _prepare_step(fleet, profile, step, force=rolling, findings=report.findings)
            # out of the router's pool only what will really go down (a refused server stays as it was)
            going = [p.instance for p in restart if p.instance.is_leader]
            if notifier:
                for leader in going:
                    router_notes[leader.name] = notifier.take_out(leader)
            step_applied = settled + _restart(fleet, profile, restart, report.findings)
            applied.extend(step_applied)
            step_ready: list[Readiness] = []
            if wait:
                step_ready = wait_ready(
                    fleet, profile, step_applied, timeout_s=timeout, on_update=_live(console, step_applied)
                )
                readiness.extend(step_ready)
            ok = {r.instance.name for r in step_ready if r.state == "ready"} if wait else {
                a.instance.name for a in step_applied if a.action != "refused"
            }
            back_ok = True
            if notifier:
                for leader in going:
                    # back in the pool only once healthy (--no-wait: once started); a failed one stays out
                    note = notifier.put_back(leader) if leader.name in ok else None
                    if note:
                        router_notes[leader.name] += f"; {note}"
                        back_ok = back_ok and note.startswith("re-added") and _in_pool(notifier, leader)
            if rolling and (len(ok) < len(out) or not back_ok):
                # never take down the next server of a role while one is not back
                report.findings.append(_rolling_stopped(step, steps))
                break
    if notifier:  # what an interrupted earlier launch left out of the pool and this run did not restart
        for url, note in notifier.restore_left_over().items():
            report.findings.append(Finding.ok("launch.router", "-", url, note))
    report.results = _launch_results(applied, readiness)
    for row in report.results:
        if row["instance"] in router_notes:
            row["router"] = router_notes[row["instance"]]
        if row["instance"] in alone_notes:
            row["rolling"] = alone_notes[row["instance"]]
    if notifier and notifier.removed:
        report.findings.append(
            Finding.warn(
                "launch.router",
                "-",
                "router",
                f"{', '.join(sorted(notifier.removed))} left out of the router's pool (not healthy after restart)",
                remedy="fix the server (`inferctl logs`), relaunch it, then "
                "`inferctl router workers add URL --role ROLE`",
            )
        )
    report.findings.extend(_readiness_findings(readiness))
    report.findings.extend(_refusal_findings(applied))
    return report


def _prepare_step(
    fleet: Fleet, profile: Profile, step: rolling_plan.Step, *, force: bool, findings: list[Finding]
) -> tuple[list[Applied], list[Prepared]]:
    """Write one step's files and read states and port holders everywhere; returns the servers settled
    without a restart (unchanged, or refused: a foreign process on a port, no GID index) and the
    instances to restart (every rank of a server, when any rank needs it or `force`)."""
    by_node: dict[str, list[Instance]] = {}
    for i in step.instances:
        by_node.setdefault(i.node, []).append(i)
    prepared: dict[str, Prepared] = {}
    nodes = [profile.node(n) for n in by_node]
    for o in fleet.map(nodes, lambda c, n: prepare_node(c, profile, by_node[n.name])):
        if o.error is not None:
            findings.extend(_node_failure(o.node.name, by_node[o.node.name], o.error))
        else:
            prepared.update((p.instance.name, p) for p in o.value or [])
    settled: list[Applied] = []
    restart: list[Prepared] = []
    for server in step.servers:
        preps = [prepared[i.name] for i in server if i.name in prepared]
        if len(preps) < len(server):
            continue  # a rank's node failed: its findings say so; the other ranks are left as they are
        why = refusal(preps)
        if why:
            settled.extend(Applied(p.instance, p.supervisor, "refused", p.changed, why[1], why[0]) for p in preps)
        elif force or any(p.needs_start for p in preps):
            restart.extend(preps)
        else:
            settled.extend(Applied(p.instance, p.supervisor, "unchanged") for p in preps)
    return settled, restart


def _restart(fleet: Fleet, profile: Profile, restart: list[Prepared], findings: list[Finding]) -> list[Applied]:
    """Stop every running rank to restart (all nodes in parallel), then start them: a multi-node server's
    ranks stop together and start together. A server with a rank that could not be stopped is not
    started."""
    stopped = _per_node(fleet, profile, [p for p in restart if p.up], stop_node_for_restart, findings)
    failed_stop = {p.instance.name for p in restart if p.up} - {p.instance.name for p in stopped}
    bad_servers = {p.instance.group or p.instance.name for p in restart if p.instance.name in failed_stop}
    to_start = [p for p in restart if (p.instance.group or p.instance.name) not in bad_servers]
    started: list[Applied] = _per_node(fleet, profile, to_start, start_node, findings)
    return started


def _per_node(
    fleet: Fleet,
    profile: Profile,
    preps: list[Prepared],
    fn: Callable[[Connector, Profile, list[Prepared]], Any],
    findings: list[Finding],
) -> list[Any]:
    """`fn(conn, profile, preps of that node)` on every node in parallel; returns the preps (or what fn
    returns, when a list) of the nodes that succeeded."""
    by_node: dict[str, list[Prepared]] = {}
    for p in preps:
        by_node.setdefault(p.instance.node, []).append(p)
    done: list[Any] = []
    for o in fleet.map([profile.node(n) for n in by_node], lambda c, n: fn(c, profile, by_node[n.name])):
        if o.error is not None:
            findings.extend(_node_failure(o.node.name, [p.instance for p in by_node[o.node.name]], o.error))
        else:
            done.extend(o.value if isinstance(o.value, list) else by_node[o.node.name])
    return done


def _in_pool(notifier: RouterNotifier, inst: Instance, wait_s: float = 10.0) -> bool:
    """The router sees the re-added server healthy (its add runs one health check; a later check may
    still be needed), so the next server can go."""
    deadline = time.monotonic() + wait_s
    while True:
        seen = notifier.healthy_in_pool(inst)
        if seen is None or seen:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def _lock_findings(taken: list[lock.Taken]) -> list[Finding]:
    return [
        Finding.warn(
            "launch.lock",
            t.node,
            t.path,
            f"took over a stale lock: it was {t.took_over.describe()}, and that process is gone",
            remedy="nothing to do; if that run was interrupted, check `inferctl status`",
        )
        for t in taken
        if t.took_over is not None
    ]


def _rolling_stopped(step: rolling_plan.Step, steps: list[rolling_plan.Step]) -> Finding:
    left = [i.name for s in steps[steps.index(step) + 1 :] for i in s.leaders]
    names = ", ".join(i.name for i in step.leaders)
    return Finding.fail(
        "launch.rolling",
        "-",
        "rolling",
        f"stopped after {names}: not back in service; not restarted: {', '.join(left) or 'none'}",
        remedy="fix it (`inferctl logs NAME`), then rerun `inferctl launch --rolling`",
    )


def _node_failure(node: str, insts: list[Instance], error: InferctlError) -> list[Finding]:
    return [
        Finding.unknown("launch.start", node, i.name, error.message, remedy=error.remedy or "check the node")
        for i in insts
    ]


def _launch_results(applied: list[Applied], readiness: list[Readiness]) -> list[dict[str, Any]]:
    ready = {r.instance.name: r for r in readiness}
    rows = []
    for a in applied:
        r = ready.get(a.instance.name)
        rows.append(
            {
                "instance": a.instance.name,
                "node": a.instance.node,
                "role": a.instance.role,
                "supervisor": a.supervisor,
                "action": a.action,
                "changed_files": a.changed_files,
                "state": "refused" if a.action == "refused" else (
                    r.state if r else ("started" if a.instance.is_leader else "follower")
                ),
                "elapsed_s": round(r.elapsed_s, 1) if r else None,
                "error": a.error or (r.error if r else None),
                "log_tail": r.log_tail if r and r.log_tail else None,
            }
        )
    return rows


_REFUSAL_REMEDY = {
    "launch.port_in_use": "stop that process (`inferctl stop` stops an SGLang server it finds on the port), "
    "or move this instance to another port; then rerun `inferctl launch`",
    "launch.gid_index": "run `inferctl check fabric` on the node; fix the HCA (RoCE v2 GID of the "
    "profile's fabric.gid_family), or pin nodes[].rdma.gid_index",
}


def _refusal_findings(applied: list[Applied]) -> list[Finding]:
    return [
        Finding.fail(
            a.refused_check or "launch.refused",
            a.instance.node,
            a.instance.name,
            f"not started: {a.error}",
            remedy=_REFUSAL_REMEDY.get(a.refused_check or "", "see `inferctl launch --dry-run`"),
        )
        for a in applied
        if a.action == "refused" and a.instance.is_leader
    ]


def _readiness_findings(readiness: list[Readiness]) -> list[Finding]:
    out = []
    for r in readiness:
        i = r.instance
        if r.state == "ready":
            out.append(Finding.ok("launch.ready", i.node, i.name, f"healthy at {i.url}"))
        else:
            out.append(
                Finding.fail(
                    "launch.ready",
                    i.node,
                    i.name,
                    r.error or "not ready",
                    details={"log_tail": r.log_tail},
                    remedy=f"read the log: `inferctl logs {i.name}`; fix the cause and rerun `inferctl launch`",
                )
            )
    return out


def _live(console: Console | None, step: list[Applied]) -> Callable[[list[Readiness]], None] | None:
    if console is None:
        return None
    live = Live(console=console, transient=True, auto_refresh=False)
    live.start()

    def update(states: list[Readiness]) -> None:
        table = Table("instance", "state", "elapsed", box=None)
        for s in states:
            table.add_row(s.instance.name, s.state, f"{s.elapsed_s:.0f}s")
        live.update(table, refresh=True)
        if all(s.state != "starting" for s in states):
            live.stop()

    return update


def render_launch(console: Console, report: Report) -> None:
    table = Table("instance", "node", "action", "state", "elapsed", box=None)
    for r in report.results or []:
        elapsed = f"{r['elapsed_s']:.0f}s" if r["elapsed_s"] is not None else ""
        table.add_row(r["instance"], r["node"], r["action"], r["state"], elapsed)
    if report.results:
        console.print(table)
    for r in report.results or []:
        if r.get("rolling"):
            console.print(f"{r['instance']}: {r['rolling']}", markup=False, highlight=False)
        if r.get("log_tail"):  # the server's own output: shown, never acted on by the terminal
            console.print(safe_cell(r["instance"], style="bold red"), safe_cell(f": {r['error']}; last log lines:"),
                          sep="")  # fmt: skip
            console.print(safe_cell(r["log_tail"].rstrip()), highlight=False)
    render_findings_report(console, report, show_ok=False)


# ---- status / stop / logs ------------------------------------------------------------------------------
def status(profile: Profile, nodes: str | None, role: str | None) -> Report:
    insts = _selection(profile, nodes, role)
    report = Report("status", profile.name)
    rows: list[dict[str, Any]] = []
    by_node = {n: [i for i in insts if i.node == n] for n in dict.fromkeys(i.node for i in insts)}
    with Fleet(profile) as fleet:
        for o in fleet.map(
            [profile.node(n) for n in by_node], lambda c, n: status_of(c, profile, by_node[n.name])
        ):
            if o.error is not None:
                report.findings.extend(_node_failure(o.node.name, by_node[o.node.name], o.error))
                rows.extend(
                    {"instance": i.name, "node": i.node, "process": "unknown"} for i in by_node[o.node.name]
                )
            else:
                rows.extend(o.value or [])
    by_name = {i.name: i for i in insts}
    for row in rows:
        if row.get("systemd_result") == supervisor.START_LIMIT_HIT:
            res = supervisor.UnitResult(row["systemd_result"], row.get("restarts"))
            report.findings.append(supervisor.start_limit_finding("status.start_limit", by_name[row["instance"]], res))
        if row.get("process") not in ("running", "unknown") or (row.get("health") not in (None, "ok")):
            report.findings.append(
                Finding.fail(
                    "status.instance",
                    row["node"],
                    row["instance"],
                    f"process {row.get('process')}, health {row.get('health') or 'not probed'}",
                    remedy=f"`inferctl logs {row['instance']}`, then `inferctl launch --nodes {row['node']}`",
                )
            )
    report.results = rows
    return report


def render_status(console: Console, report: Report) -> None:
    cols = ("instance", "process", "health", "model", "disaggregation_mode", "speculative_algorithm",
            "accept_length", "cache_hit_rate")  # fmt: skip
    table = Table(box=None)
    for c in cols:
        # the instance name is what the user types next (`inferctl logs NAME`): never truncate it
        table.add_column(c, no_wrap=c == "instance", min_width=len(c) if c == "instance" else None)
    for r in report.results or []:
        table.add_row(*(safe_cell(_fmt(r.get(c)), multiline=False) for c in cols))  # /server_info's text
    console.print(table)
    render_findings_report(console, report, show_ok=False)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def stop(profile: Profile, nodes: str | None, role: str | None, *, lock_wait_s: float = 0.0) -> Report:
    # every rank of a server: a rank left running after its rank 0 stopped hangs holding GPU memory
    insts = rolling_plan.whole_servers(_selection(profile, nodes, role), instances(profile))
    report = Report("stop", profile.name)
    rows: list[dict[str, Any]] = []
    node_list = [profile.node(n) for n in dict.fromkeys(i.node for i in insts)]
    with Fleet(profile) as fleet, lock.holding(fleet, profile, node_list, "stop", wait_s=lock_wait_s) as taken:
        report.findings.extend(_lock_findings(taken))
        # decodes first, fleet-wide: a prefill vanishing under a decode turns in-flight transfers into errors
        for phase in (("decode",), ("prefill", "collocated")):
            chosen = [i for i in insts if i.role in phase]
            by_node = {n: [i for i in chosen if i.node == n] for n in dict.fromkeys(i.node for i in chosen)}

            def one(
                conn: Connector, node: Node, b: dict[str, list[Instance]] = by_node
            ) -> list[dict[str, Any]]:
                return stop_node(conn, profile, b[node.name])

            for o in fleet.map([profile.node(n) for n in by_node], one):
                if o.error is not None:
                    report.findings.extend(_node_failure(o.node.name, by_node[o.node.name], o.error))
                else:
                    rows.extend(o.value or [])
    for r in rows:
        if r["result"] == "killed":
            report.findings.append(
                Finding.warn(
                    "stop.forced",
                    r["node"],
                    r["instance"],
                    f"did not exit within {profile.sglang.lifecycle.stop_timeout_s:.0f} s of SIGTERM; killed",
                    remedy="check for leaked RDMA registrations (reload mlx5 or reboot if transfers fail); "
                    "raise sglang.lifecycle.stop_timeout_s",
                )
            )
        if r.get("stray"):
            report.findings.append(
                Finding.warn(
                    "stop.stray",
                    r["node"],
                    r["instance"],
                    r["stray"],
                    remedy="a server outlived its pid file (an interrupted or concurrent launch); "
                    "nothing left to do, `inferctl status` shows the state",
                )
            )
        if r.get("foreign"):
            report.findings.append(
                Finding.warn(
                    "stop.port_in_use",
                    r["node"],
                    r["instance"],
                    r["foreign"],
                    remedy="stop that process by hand, or move the instance to another port",
                )
            )
    report.results = rows
    return report


def render_stop(console: Console, report: Report) -> None:
    for r in report.results or []:
        extra = f" ({r['stray']})" if r.get("stray") else ""
        console.print(f"{r['instance']}: {r['result']}{extra}", markup=False, highlight=False)
    render_findings_report(console, report, show_ok=False)


def logs(
    profile: Profile,
    name: str,
    *,
    lines: int,
    since: str | None,
    follow: bool,
    write: Callable[[str], None],
    poll_s: float = 1.0,
    max_polls: int | None = None,
) -> None:
    inst = find_instance(profile, name)
    with Fleet(profile) as fleet:
        conn = fleet.connector(profile.node(inst.node))
        sup = supervisor.detect_supervisor(conn, profile)
        if since and sup == "process":
            raise UsageError(
                f"--since needs the systemd journal; {inst.node} runs {inst.name} as a plain process with a log file",
                remedy="use --lines N instead",
            )
        chunk = supervisor.read_log(conn, inst, sup, sudo=profile.ssh.sudo, lines=lines, since=since)
        write(chunk.text)
        polls = 0
        while follow and (max_polls is None or polls < max_polls):
            time.sleep(poll_s)
            polls += 1
            chunk = supervisor.read_log(conn, inst, sup, sudo=profile.ssh.sudo, cursor=chunk.cursor)
            if chunk.text:
                write(chunk.text)
