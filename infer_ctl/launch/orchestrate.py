"""The launch/status/stop flows over a fleet: per node, bring the files to what the profile renders,
(re)start only servers whose files changed or that are not running (all ranks of a multi-node server
together), then wait until each (re)started server is ready.

"Ready" is stricter than "something answers on the port": /health and /server_info answer AND, read on
the node, the socket listening on the instance's port belongs to the process this launch started (its
setsid session, or its systemd unit's cgroup). SGLang's /server_info carries no wall-clock start time or
pid (0.5.23: `startup_time` is a dict of load durations, http_server.py `get_server_info`), so the node's
/proc is what tells an answer from the new server apart from one from an orphan of an earlier run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from infer_ctl.core.sglang import Instance, instances, unit_name, unit_path
from infer_ctl.errors import InferctlError
from infer_ctl.launch import deploy, gid, ports, probe, supervisor
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Connector


class NodeConnectors(Protocol):
    """What the waiting side needs of a Fleet (infer_ctl.remote.fleet.Fleet): a node's connector."""

    def connector(self, node: Node) -> Connector: ...


def select_instances(profile: Profile, nodes: list[Node], role: str | None) -> list[Instance]:
    names = {n.name for n in nodes}
    return [i for i in instances(profile) if i.node in names and (role is None or i.role == role)]


def owner_of(inst: Instance, sup: supervisor.Supervisor, pid: int | None) -> ports.Owner | None:
    """Who may hold the instance's ports: its unit, or the session of the pid in its pid file."""
    if sup == "systemd":
        return ports.Owner(unit=unit_name(inst))
    return ports.Owner(session=pid) if pid is not None else None


# ---- apply: prepare (files, state, port holders) -> stop -> start ---------------------------------
@dataclass
class Prepared:
    instance: Instance
    supervisor: supervisor.Supervisor
    up: bool
    changed: list[str]
    #: listeners on the instance's ports held by something other than its own running server
    foreign: list[ports.Listener] = field(default_factory=list)
    #: the RoCE GID index read on the node (None: not probed, the profile's is used)
    gid: gid.GidDecision | None = None

    @property
    def needs_start(self) -> bool:
        return bool(self.changed) or not self.up


@dataclass
class Applied:
    instance: Instance
    supervisor: supervisor.Supervisor
    action: str  # started | restarted | unchanged | refused
    changed_files: list[str] = field(default_factory=list)
    #: why a server was refused, and the finding's check (launch.port_in_use, launch.gid_index)
    error: str | None = None
    refused_check: str | None = None


def prepare_node(conn: Connector, profile: Profile, insts: list[Instance]) -> list[Prepared]:
    """Write the files that differ (atomically) and read each instance's state and port holders."""
    sudo = profile.ssh.sudo
    sup = supervisor.detect_supervisor(conn, profile)
    out: list[Prepared] = []
    for inst in insts:
        plan = deploy.deployment(conn, profile, inst, sup)
        if plan.refused:
            # never write an env file without the index on RoCE: Mooncake would silently use GID 3
            out.append(Prepared(inst, sup, False, [], gid=plan.gid))
            continue
        supervisor.ensure_dirs(conn, inst, sudo=sudo)
        changed = []
        for f in plan.files:
            if supervisor.read_file(conn, f.path, sudo=sudo) != f.text:
                # put_file writes a temp file beside the target and renames it: never half a file
                conn.put_file(f.path, f.text.encode(), mode=f.mode, sudo=sudo)
                changed.append(f.path)
        state, pid = supervisor.process_state(conn, inst, sup, sudo=sudo)
        up = state in ("running", "activating")
        found: list[ports.Listener] = []
        if ports.instance_ports(inst):
            listening = ports.listeners(conn, [p for _, p in ports.instance_ports(inst)], sudo=sudo)
            owner = owner_of(inst, sup, pid) if up else None
            found = ports.foreign(ports.on_instance_ports(listening, inst), owner)
        out.append(Prepared(inst, sup, up, changed, found, plan.gid))
    return out


def stop_node_for_restart(conn: Connector, profile: Profile, preps: list[Prepared]) -> None:
    for p in preps:
        if p.up:
            supervisor.stop(
                conn, p.instance, p.supervisor, sudo=profile.ssh.sudo,
                timeout_s=profile.sglang.lifecycle.stop_timeout_s,
            )  # fmt: skip


def start_node(conn: Connector, profile: Profile, preps: list[Prepared]) -> list[Applied]:
    out = []
    for p in preps:
        supervisor.start(
            conn, p.instance, p.supervisor, sudo=profile.ssh.sudo,
            unit_changed=unit_path(p.instance) in p.changed,
        )  # fmt: skip
        out.append(Applied(p.instance, p.supervisor, "restarted" if p.up else "started", p.changed))
    return out


def refusal(server: Sequence[Prepared]) -> tuple[str, str] | None:
    """(check, why) a server must not be (re)started: its RoCE GID index is unknown, or a foreign process
    holds one of its ports."""
    for p in server:
        if p.gid is not None and p.gid.error:
            return "launch.gid_index", f"{p.instance.name}: MC_GID_INDEX cannot be determined: {p.gid.error}"
    held = [ln for p in server for ln in p.foreign]
    if not held:
        return None
    hint = (
        " (an SGLang server no pid file names: `inferctl stop` stops it)"
        if any(supervisor.LAUNCH_MODULE_MARK in h.command for ln in held for h in ln.holders)
        else ""
    )
    return "launch.port_in_use", "port in use: " + "; ".join(ln.describe() for ln in held) + hint


# ---- readiness ------------------------------------------------------------------------------------
@dataclass
class Readiness:
    instance: Instance
    state: str = "starting"  # starting | ready | failed
    elapsed_s: float = 0.0
    error: str | None = None
    log_tail: str = ""
    #: what answered on the port while it was not (yet) the server we started
    answered_by: str | None = None


def wait_ready(
    fleet: NodeConnectors,
    profile: Profile,
    applied: list[Applied],
    *,
    timeout_s: float,
    on_update: Callable[[list[Readiness]], None] | None = None,
    poll_s: float = 0.5,
) -> list[Readiness]:
    """Poll /health then /server_info of each (re)started leader until ready, dead, or timed out; an
    answer counts once the node shows the listener is ours. A dead process is noticed over SSH (every
    few polls) and reported with the tail of its log."""
    live = ("started", "restarted")
    pending = {a.instance.name: a for a in applied if a.action in live and a.instance.is_leader}
    # a refused server was never started: launch.port_in_use says why, there is nothing to wait for
    states = {
        a.instance.name: Readiness(a.instance, "ready" if a.action == "unchanged" else "starting")
        for a in applied
        if a.instance.is_leader and a.action != "refused"
    }
    started = time.monotonic()
    rounds = 0
    with probe.client(timeout=2.0) as http:
        while pending:
            rounds += 1
            elapsed = time.monotonic() - started
            for name, a in list(pending.items()):
                st = states[name]
                st.elapsed_s = elapsed
                answers = probe.health(http, a.instance).ok and probe.server_info(http, a.instance).ok
                if answers and (st.answered_by is None or rounds % 4 == 0):
                    ours, other = _listener_is_ours(fleet, profile, a)
                    if ours:
                        st.state, st.answered_by = "ready", None
                        del pending[name]
                        continue
                    st.answered_by = other
                if rounds % 4 == 0 or elapsed > timeout_s:
                    why = _dead_or_timeout(fleet, profile, a, elapsed > timeout_s, timeout_s)
                    if why:
                        if st.answered_by:
                            why += f"; meanwhile {st.answered_by} answered on its port"
                        st.state, st.error = "failed", why
                        st.log_tail = _log_tail(fleet, profile, a)
                        del pending[name]
            if on_update:
                on_update(list(states.values()))
            if pending:
                time.sleep(poll_s)
    return list(states.values())


def _listener_is_ours(fleet: NodeConnectors, profile: Profile, a: Applied) -> tuple[bool, str | None]:
    """Is the socket on the instance's HTTP port held by the server we started? (ours, what holds it)"""
    inst = a.instance
    try:
        conn = fleet.connector(profile.node(inst.node))
        state, pid = supervisor.process_state(conn, inst, a.supervisor, sudo=profile.ssh.sudo)
        if state not in ("running", "activating"):
            return False, None  # the dead check names it
        found = [
            ln for ln in ports.listeners(conn, [inst.port], sudo=profile.ssh.sudo)
            if ports.overlaps(ln.address, inst.bind_host)
        ]  # fmt: skip
    except InferctlError as exc:
        return False, f"(cannot inspect the node: {exc.message})"
    owner = owner_of(inst, a.supervisor, pid)
    other = ports.foreign(found, owner)
    if found and not other:
        return True, None
    if a.supervisor == "systemd" and other and all(not ln.holders for ln in other):
        # a unit running as another user, and no sudo to read its fds: the unit is active and the
        # port answers; this is as far as the node lets us look
        return True, None
    return False, "; ".join(ln.describe() for ln in other) or None


def _dead_or_timeout(
    fleet: NodeConnectors, profile: Profile, a: Applied, timed_out: bool, timeout_s: float
) -> str | None:
    node = profile.node(a.instance.node)
    try:
        state, _ = supervisor.process_state(
            fleet.connector(node), a.instance, a.supervisor, sudo=profile.ssh.sudo
        )
    except InferctlError as exc:
        return f"cannot inspect the process: {exc.message}"
    if state in ("dead", "failed", "stopped"):
        return f"the server process exited ({state}) before it became healthy"
    if timed_out:
        return f"not healthy after {timeout_s:.0f} s (process still {state})"
    return None


def _log_tail(fleet: NodeConnectors, profile: Profile, a: Applied, lines: int = 20) -> str:
    try:
        conn = fleet.connector(profile.node(a.instance.node))
        return supervisor.read_log(conn, a.instance, a.supervisor, sudo=profile.ssh.sudo, lines=lines).text
    except InferctlError as exc:
        return f"(log unavailable: {exc.message})"


# ---- status / stop ---------------------------------------------------------------------------------
def status_of(conn: Connector, profile: Profile, insts: list[Instance]) -> list[dict[str, Any]]:
    """Process state over SSH plus what the server says about itself over HTTP."""
    sup = supervisor.detect_supervisor(conn, profile)
    rows = []
    with probe.client(timeout=3.0) as http:
        for inst in insts:
            state, pid = supervisor.process_state(conn, inst, sup, sudo=profile.ssh.sudo)
            row: dict[str, Any] = {
                "instance": inst.name,
                "node": inst.node,
                "role": inst.role,
                "url": inst.url,
                "supervisor": sup,
                "process": state,
                "pid": pid,
                "health": None,
            }
            if sup == "systemd":
                unit = supervisor.unit_result(conn, inst)
                row["systemd_result"] = unit.result
                row["restarts"] = unit.restarts
            if inst.is_leader and state in ("running", "activating"):
                row.update(_http_status(http, inst))
            rows.append(row)
    return rows


def _http_status(http: Any, inst: Instance) -> dict[str, Any]:
    h = probe.health(http, inst)
    row: dict[str, Any] = {"health": "ok" if h.ok else (h.error or "unhealthy")}
    info = probe.server_info(http, inst)
    if info.ok:
        d = info.data
        states = d.get("internal_states") or [{}]
        row.update(
            model=d.get("served_model_name") or d.get("model_path"),
            disaggregation_mode=d.get("disaggregation_mode"),
            speculative_algorithm=d.get("speculative_algorithm"),
            accept_length=states[0].get("avg_spec_accept_length"),
        )
    ld = probe.loads(http, inst)
    if ld.ok and ld.data.get("loads"):
        first = ld.data["loads"][0]
        row["cache_hit_rate"] = first.get("cache_hit_rate")
        spec = first.get("speculative") or {}
        if spec.get("accept_length") is not None:
            row["accept_length"] = spec["accept_length"]
    return row


def stop_node(conn: Connector, profile: Profile, insts: list[Instance]) -> list[dict[str, Any]]:
    sup = supervisor.detect_supervisor(conn, profile)
    # decodes first: a prefill that vanishes under a decode turns in-flight transfers into errors
    order = sorted(insts, key=lambda i: 0 if i.role == "decode" else 1)
    return [_stop_one(conn, profile, i, sup) for i in order]


def _stop_one(conn: Connector, profile: Profile, inst: Instance, sup: supervisor.Supervisor) -> dict[str, Any]:
    """Stop the instance's server; then whatever still listens on its ports: an SGLang server there is an
    orphan its pid file lost track of (stopped too, and said so); anything else is left alone."""
    sudo, timeout = profile.ssh.sudo, profile.sglang.lifecycle.stop_timeout_s
    row: dict[str, Any] = {"instance": inst.name, "node": inst.node,
                           "result": supervisor.stop(conn, inst, sup, sudo=sudo, timeout_s=timeout)}  # fmt: skip
    if not ports.instance_ports(inst):
        return row
    left = ports.on_instance_ports(
        ports.listeners(conn, [p for _, p in ports.instance_ports(inst)], sudo=sudo), inst
    )
    strays = {h.pid: h for ln in left for h in ln.holders if supervisor.LAUNCH_MODULE_MARK in h.command}
    if strays:
        how = supervisor.stop_strays(
            conn, [(h.pid, h.sid == h.pid or h.pgid == h.pid) for h in strays.values()],
            sudo=sudo, timeout_s=timeout,
        )  # fmt: skip
        what = "pid file stale" if sup == "process" else f"not in {unit_name(inst)}"
        row["stray"] = f"{what}: stopped " + "; ".join(
            ln.describe() for ln in left if any(h.pid in strays for h in ln.holders)
        )
        row["result"] = "killed" if "killed" in (how, row["result"]) else "stopped"
    others = [ln for ln in left if not any(h.pid in strays for h in ln.holders)]
    if others:
        row["foreign"] = "; ".join(ln.describe() for ln in others) + " (not an SGLang server: left running)"
    return row
