"""Running one instance on its node: systemd units where systemd runs, otherwise a managed background
process (pid file + log file; the path the test harness and container nodes use).

Every function takes a connector and an instance and runs a few shell commands; none keeps state.
Stopping is always graceful first: SIGTERM, wait, and SIGKILL only after the stop timeout, because a
killed SGLang server leaks its RDMA memory registrations.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang import Instance, env_file_path, log_file_path, pid_file_path, unit_name
from infer_ctl.errors import RemoteError
from infer_ctl.profile import Profile
from infer_ctl.remote.base import Command, Connector

Supervisor = Literal["systemd", "process"]
ProcState = Literal["running", "stopped", "dead", "failed", "activating", "unknown"]
LAUNCH_MODULE_MARK = "sglang.launch_server"


class LaunchError(RemoteError):
    """A server could not be started, stopped or inspected on its node."""


def run_file_path(instance: Instance) -> str:
    """The process supervisor's equivalent of the unit: a script that execs the server."""
    return f"{instance.config_dir.rstrip('/')}/sglang-{instance.role}.run"


def render_run_script(argv: list[str], instance: Instance) -> str:
    return (
        "#!/bin/sh\n"
        f"# {instance.name}: SGLang {instance.role} server, started by `inferctl launch` (no systemd on this node).\n"
        "# Written by inferctl; edits are overwritten. Change the profile instead.\n"
        f"exec {shlex.join(argv)}\n"
    )


def _sh(
    conn: Connector, script: str, *args: str, sudo: bool, timeout: float = 60.0
) -> tuple[int | None, str, str]:
    res = conn.run(Command("sh", "-c", script, "inferctl", *args), sudo=sudo, timeout=timeout)
    return res.exit_code, res.out, res.err


def detect_supervisor(conn: Connector, profile: Profile) -> Supervisor:
    setting = profile.sglang.lifecycle.supervisor
    if setting != "auto":
        return setting
    # sd_booted(3): systemd is PID 1 exactly when /run/systemd/system exists
    code, _, _ = _sh(conn, "[ -d /run/systemd/system ] && command -v systemctl >/dev/null", sudo=False)
    return "systemd" if code == 0 else "process"


def read_file(conn: Connector, path: str, *, sudo: bool) -> str | None:
    code, out, _ = _sh(conn, 'if [ -f "$1" ]; then cat -- "$1"; else exit 3; fi', path, sudo=sudo)
    return out if code == 0 else None


def ensure_dirs(conn: Connector, instance: Instance, *, sudo: bool) -> None:
    code, _, err = _sh(conn, 'mkdir -p -- "$1" "$2"', instance.config_dir, instance.log_dir, sudo=sudo)
    if code != 0:
        raise LaunchError(
            f"{instance.node}: cannot create {instance.config_dir} / {instance.log_dir}: {err.strip()}",
            remedy="run `inferctl provision --apply`, enable ssh.sudo, or point sglang.lifecycle.config_dir "
            "and sglang.log_dir at writable directories",
        )


_PROCESS_STATE = r"""
pid=$(cat -- "$1" 2>/dev/null) || { echo stopped; exit 0; }
if kill -0 "$pid" 2>/dev/null && grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null; then echo "running $pid"; else echo dead; fi
"""


def process_state(
    conn: Connector, instance: Instance, supervisor: Supervisor, *, sudo: bool
) -> tuple[ProcState, int | None]:
    if supervisor == "systemd":
        _, out, _ = _sh(conn, 'systemctl is-active -- "$1" || true', unit_name(instance), sudo=False)
        word = (out.strip().splitlines() or ["unknown"])[-1]
        mapping: dict[str, ProcState] = {
            "active": "running",
            "activating": "activating",
            "reloading": "running",
            "inactive": "stopped",
            "deactivating": "running",
            "failed": "failed",
        }
        return mapping.get(word, "unknown"), None
    code, out, err = _sh(conn, _PROCESS_STATE, pid_file_path(instance), LAUNCH_MODULE_MARK, sudo=sudo)
    words = out.split()
    if code != 0 or not words:
        raise LaunchError(f"{instance.node}: cannot read the state of {instance.name}: {err.strip()}")
    if words[0] == "running":
        return "running", int(words[1])
    return ("stopped" if words[0] == "stopped" else "dead"), None


START_LIMIT_HIT = "start-limit-hit"


@dataclass(frozen=True)
class UnitResult:
    """systemd's verdict on a unit's last run (`systemctl show`): Result= ("success", "exit-code",
    "oom-kill", "start-limit-hit", ...) and NRestarts= (automatic restarts since it was started)."""

    result: str | None
    restarts: int | None

    @property
    def start_limit_hit(self) -> bool:
        return self.result == START_LIMIT_HIT


def unit_result(conn: Connector, instance: Instance) -> UnitResult:
    _, out, _ = _sh(conn, 'systemctl show -p Result -p NRestarts -- "$1" || true', unit_name(instance), sudo=False)
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    restarts = props.get("NRestarts", "")
    return UnitResult(props.get("Result") or None, int(restarts) if restarts.isdigit() else None)


def start_limit_finding(check: str, instance: Instance, res: UnitResult) -> Finding:
    """FAIL: systemd gave up restarting the server (its start limit: sglang.lifecycle.restart_limit_burst)."""
    tries = f" after {res.restarts} automatic restart(s)" if res.restarts is not None else ""
    return Finding.fail(
        check,
        instance.node,
        instance.name,
        f"systemd stopped restarting {unit_name(instance)}{tries}: start limit hit (the server keeps "
        "failing at start, e.g. out of memory while loading)",
        details={"unit": unit_name(instance), "result": res.result, "restarts": res.restarts},
        remedy=f"read why it fails (`inferctl logs {instance.name}`), fix it, then `inferctl launch --nodes "
        f"{instance.node}` (it clears the start limit with systemctl reset-failed)",
    )


_PROCESS_START = r"""
set -e
env_file=$1; run_file=$2; log=$3; pidf=$4
: >> "$log"
printf '%s inferctl: starting %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$run_file" >> "$log"
# setsid: the server leaves the SSH session's process group and survives the disconnect
setsid sh -c 'set -a; . "$1"; set +a; exec sh "$2"' inferctl-sglang "$env_file" "$run_file" >> "$log" 2>&1 < /dev/null &
echo $! > "$pidf"
echo $!
"""


def start(
    conn: Connector, instance: Instance, supervisor: Supervisor, *, sudo: bool, unit_changed: bool
) -> None:
    if supervisor == "systemd":
        unit = unit_name(instance)
        # reset-failed first: a unit that hit its start limit refuses `restart` ("Start request
        # repeated too quickly") until its failure state is cleared
        script = (
            "systemctl daemon-reload && " if unit_changed else ""
        ) + 'systemctl enable -q -- "$1" && { systemctl reset-failed -- "$1" 2>/dev/null; systemctl restart -- "$1"; }'
        code, _, err = _sh(conn, script, unit, sudo=sudo, timeout=120)
    else:
        code, _, err = _sh(
            conn,
            _PROCESS_START,
            env_file_path(instance),
            run_file_path(instance),
            log_file_path(instance),
            pid_file_path(instance),
            sudo=sudo,
        )
    if code != 0:
        raise LaunchError(
            f"{instance.node}: cannot start {instance.name}: {err.strip() or f'exit {code}'}",
            remedy=f"see `inferctl logs {instance.name}`",
        )


_PROCESS_STOP = r"""
pidf=$1; timeout_ds=$2; mark=$3
pid=$(cat -- "$pidf" 2>/dev/null) || { echo not-running; exit 0; }
if ! { kill -0 "$pid" 2>/dev/null && grep -q "$mark" "/proc/$pid/cmdline" 2>/dev/null; }; then
  rm -f -- "$pidf"; echo not-running; exit 0
fi
# the server was started under setsid, so its pid is also its process group: the group holds the
# scheduler/detokenizer children SGLang forks, which must not outlive it holding GPU memory.
# `kill -s SIG -- -PGID`: dash's kill misreads `kill -KILL -- -PGID`.
kill -TERM "$pid"
i=0
while kill -0 "$pid" 2>/dev/null && [ "$i" -lt "$timeout_ds" ]; do sleep 0.1; i=$((i+1)); done
if kill -0 "$pid" 2>/dev/null; then
  # only after the graceful window: SIGKILL leaks RDMA registrations
  kill -s KILL -- "-$pid" 2>/dev/null || kill -s KILL "$pid" 2>/dev/null; echo killed
else
  # the server is gone; children it left behind get the same graceful-then-forceful treatment
  if kill -s 0 -- "-$pid" 2>/dev/null; then
    kill -s TERM -- "-$pid" 2>/dev/null
    while kill -s 0 -- "-$pid" 2>/dev/null && [ "$i" -lt "$timeout_ds" ]; do sleep 0.1; i=$((i+1)); done
    kill -s KILL -- "-$pid" 2>/dev/null
  fi
  echo stopped
fi
rm -f -- "$pidf"
"""


def stop(conn: Connector, instance: Instance, supervisor: Supervisor, *, sudo: bool, timeout_s: float) -> str:
    """Graceful stop; returns "stopped", "killed" (after the timeout) or "not-running"."""
    if supervisor == "systemd":
        # systemd sends SIGTERM and escalates to SIGKILL after the unit's TimeoutStopSec
        code, _, err = _sh(
            conn, 'systemctl stop -- "$1"', unit_name(instance), sudo=sudo, timeout=timeout_s + 30
        )
        if code != 0:
            raise LaunchError(f"{instance.node}: cannot stop {instance.name}: {err.strip()}")
        return "stopped"
    code, out, err = _sh(
        conn,
        _PROCESS_STOP,
        pid_file_path(instance),
        str(int(timeout_s * 10)),
        LAUNCH_MODULE_MARK,
        sudo=sudo,
        timeout=timeout_s + 30,
    )
    if code != 0:
        raise LaunchError(f"{instance.node}: cannot stop {instance.name}: {err.strip()}")
    return (out.split() or ["stopped"])[-1]


_STRAYS_STOP = r"""
timeout_ds=$1; shift
# each argument is PID:GROUP (GROUP 0: signal the pid alone)
# a zombie still answers kill -0 until its parent reaps it; it no longer runs
alive() { for t in "$@"; do p=${t%%:*}
  kill -0 "$p" 2>/dev/null && [ "$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -c1)" != Z ] && return 0
done; return 1; }
sig() { for t in "$@"; do p=${t%%:*}; g=${t#*:}
  if [ "$g" != 0 ]; then kill -s "$S" -- "-$g" 2>/dev/null || kill -s "$S" "$p" 2>/dev/null; else kill -s "$S" "$p" 2>/dev/null; fi
done; }
S=TERM; sig "$@"
i=0
while alive "$@" && [ "$i" -lt "$timeout_ds" ]; do sleep 0.1; i=$((i+1)); done
if alive "$@"; then S=KILL; sig "$@"; echo killed; else echo stopped; fi
"""


def stop_strays(
    conn: Connector, targets: list[tuple[int, bool]], *, sudo: bool, timeout_s: float
) -> str:
    """Stop processes no pid file or unit names (an orphaned server still holding its port): SIGTERM,
    wait, SIGKILL after the timeout. `(pid, whole_group)`: the group too when the pid leads its own
    session (as a server started by `launch` does), so its scheduler children go with it; a process
    inside someone else's session is signalled alone. Returns "stopped" or "killed"."""
    args = [f"{pid}:{pid if group else 0}" for pid, group in targets]
    code, out, err = _sh(
        conn, _STRAYS_STOP, str(int(timeout_s * 10)), *args, sudo=sudo, timeout=timeout_s + 30
    )
    if code != 0:
        raise LaunchError(f"{conn.node_name}: cannot stop pid(s) {', '.join(args)}: {err.strip()}")
    return (out.split() or ["stopped"])[-1]


@dataclass(frozen=True)
class LogChunk:
    text: str
    #: where to continue following (byte offset of a log file, or a journal cursor)
    cursor: str | None


def read_log(
    conn: Connector,
    instance: Instance,
    supervisor: Supervisor,
    *,
    sudo: bool,
    lines: int = 100,
    since: str | None = None,
    cursor: str | None = None,
) -> LogChunk:
    """The log tail, or what was appended after `cursor` (for --follow)."""
    if supervisor == "systemd":
        cmd = ["journalctl", "-u", unit_name(instance), "--no-pager", "-o", "short-iso", "--show-cursor"]
        if cursor:
            cmd += ["--after-cursor", cursor]
        else:
            cmd += ["-n", str(lines)]
            if since:
                cmd += ["--since", since]
        res = conn.run(Command(*cmd), sudo=sudo, timeout=60)
        text, new_cursor = res.out, cursor
        tail = text.rstrip("\n").rsplit("\n", 1)
        if tail and tail[-1].startswith("-- cursor: "):
            new_cursor = tail[-1][len("-- cursor: ") :]
            text = tail[0] + "\n" if len(tail) > 1 else ""
        return LogChunk(text, new_cursor)
    path = log_file_path(instance)
    if cursor is None:
        script = 'f=$1; [ -f "$f" ] || exit 3; wc -c < "$f"; tail -n "$2" -- "$f"'
        code, out, _ = _sh(conn, script, path, str(lines), sudo=sudo)
    else:
        script = 'f=$1; [ -f "$f" ] || exit 3; wc -c < "$f"; tail -c "+$(($2 + 1))" -- "$f"'
        code, out, _ = _sh(conn, script, path, cursor, sudo=sudo)
    if code == 3:
        raise LaunchError(
            f"{instance.node}: {instance.name} has no log file {path} (never launched here?)",
            remedy=f"run `inferctl launch --nodes {instance.node}`",
        )
    size, _, text = out.partition("\n")
    if cursor is not None:
        # bytes appended since the cursor: the size line was taken before tail ran, so re-derive it
        return LogChunk(text, str(int(cursor) + len(text.encode())))
    return LogChunk(text, size.strip() or "0")
