"""The launch/status/stop flows over a fleet: per node, bring the files to what the profile renders,
(re)start only instances whose files changed or that are not running, then wait for readiness."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.sglang import Instance, build_argv, env_file_path, instances, unit_path
from infer_ctl.errors import InferctlError
from infer_ctl.launch import probe, supervisor
from infer_ctl.launch.render import render_env_file, render_unit
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Connector


def select_instances(profile: Profile, nodes: list[Node], role: str | None) -> list[Instance]:
    names = {n.name for n in nodes}
    return [i for i in instances(profile) if i.node in names and (role is None or i.role == role)]


def desired_files(profile: Profile, inst: Instance, sup: supervisor.Supervisor) -> dict[str, str]:
    files = {env_file_path(inst): render_env_file(profile, inst)}
    if sup == "systemd":
        files[unit_path(inst)] = render_unit(profile, inst)
    else:
        files[supervisor.run_file_path(inst)] = supervisor.render_run_script(
            build_argv(profile, inst).argv, inst
        )
    return files


def _file_mode(path: str) -> int:
    if path.endswith(".run"):
        return 0o755
    # sglang.env may carry tokens (HF_TOKEN) a user put there despite the advice; only the owner (root
    # for systemd's EnvironmentFile, the launching user for the process supervisor) reads it
    return 0o600 if path.endswith(".env") else 0o644


@dataclass
class Applied:
    instance: Instance
    supervisor: supervisor.Supervisor
    action: str  # started | restarted | unchanged
    changed_files: list[str] = field(default_factory=list)


def apply_node(
    conn: Connector, profile: Profile, insts: list[Instance], *, force: bool = False
) -> list[Applied]:
    sudo = profile.ssh.sudo
    sup = supervisor.detect_supervisor(conn, profile)
    out: list[Applied] = []
    for inst in insts:
        supervisor.ensure_dirs(conn, inst, sudo=sudo)
        changed = []
        for path, text in desired_files(profile, inst, sup).items():
            if supervisor.read_file(conn, path, sudo=sudo) != text:
                # put_file writes a temp file beside the target and renames it: never half a file
                conn.put_file(path, text.encode(), mode=_file_mode(path), sudo=sudo)
                changed.append(path)
        state, _ = supervisor.process_state(conn, inst, sup, sudo=sudo)
        up = state in ("running", "activating")
        if up and not changed and not force:
            out.append(Applied(inst, sup, "unchanged"))
            continue
        if up and sup == "process":
            supervisor.stop(conn, inst, sup, sudo=sudo, timeout_s=profile.sglang.lifecycle.stop_timeout_s)
        supervisor.start(conn, inst, sup, sudo=sudo, unit_changed=unit_path(inst) in changed)
        out.append(Applied(inst, sup, "restarted" if up else "started", changed))
    return out


@dataclass
class Readiness:
    instance: Instance
    state: str = "starting"  # starting | ready | failed
    elapsed_s: float = 0.0
    error: str | None = None
    log_tail: str = ""


def wait_ready(
    fleet: Any,
    profile: Profile,
    applied: list[Applied],
    *,
    timeout_s: float,
    on_update: Callable[[list[Readiness]], None] | None = None,
    poll_s: float = 0.5,
) -> list[Readiness]:
    """Poll /health then /server_info of each (re)started leader until ready, dead, or timed out.
    A dead process is noticed over SSH (every few polls) and reported with the tail of its log."""
    pending = {a.instance.name: a for a in applied if a.action != "unchanged" and a.instance.is_leader}
    states = {a.instance.name: Readiness(a.instance) for a in applied if a.instance.is_leader}
    for a in applied:
        if a.action == "unchanged" and a.instance.is_leader:
            states[a.instance.name].state = "ready"
    started = time.monotonic()
    rounds = 0
    with probe.client(timeout=2.0) as http:
        while pending:
            rounds += 1
            elapsed = time.monotonic() - started
            for name, a in list(pending.items()):
                st = states[name]
                st.elapsed_s = elapsed
                h = probe.health(http, a.instance)
                if h.ok and probe.server_info(http, a.instance).ok:
                    st.state = "ready"
                    del pending[name]
                    continue
                if rounds % 4 == 0 or elapsed > timeout_s:
                    why = _dead_or_timeout(fleet, profile, a, elapsed > timeout_s, timeout_s)
                    if why:
                        st.state, st.error = "failed", why
                        st.log_tail = _log_tail(fleet, profile, a)
                        del pending[name]
            if on_update:
                on_update(list(states.values()))
            if pending:
                time.sleep(poll_s)
    return list(states.values())


def _dead_or_timeout(
    fleet: Any, profile: Profile, a: Applied, timed_out: bool, timeout_s: float
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


def _log_tail(fleet: Any, profile: Profile, a: Applied, lines: int = 20) -> str:
    try:
        conn = fleet.connector(profile.node(a.instance.node))
        return supervisor.read_log(conn, a.instance, a.supervisor, sudo=profile.ssh.sudo, lines=lines).text
    except InferctlError as exc:
        return f"(log unavailable: {exc.message})"


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
    return [
        {
            "instance": i.name,
            "node": i.node,
            "result": supervisor.stop(
                conn, i, sup, sudo=profile.ssh.sudo, timeout_s=profile.sglang.lifecycle.stop_timeout_s
            ),
        }
        for i in order
    ]
