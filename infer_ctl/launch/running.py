"""What a node has for one instance, read in one SSH command: the deployed files (env file, unit or run
script) and the running server's command line and environment (/proc/PID/cmdline and environ; the pid
from the pid file, or the unit's MainPID). For `check servers`' file and restart-pending checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.sglang import Instance, env_file_path, pid_file_path, unit_name, unit_path
from infer_ctl.core.sglang.deployed import RunningServer
from infer_ctl.launch import supervisor
from infer_ctl.remote.base import Command, Connector

_MARK = "@@inferctl:"
# $1 env file, $2 unit or run file, $3 supervisor, $4 pid file or unit name. NULs become newlines
# (values with a newline cannot be in an env file: envfile.quote_env_value refuses them).
_INSPECT = r"""
M=@@inferctl:
for f in "$1" "$2"; do
  if [ -f "$f" ]; then echo "${M}file $f"; cat -- "$f"; echo; echo "${M}end"; fi
done
if [ "$3" = systemd ]; then pid=$(systemctl show -p MainPID --value -- "$4" 2>/dev/null); else pid=$(cat -- "$4" 2>/dev/null); fi
case "$pid" in ''|0|*[!0-9]*) exit 0 ;; esac
[ -r "/proc/$pid/cmdline" ] || exit 0
echo "${M}pid $pid"
echo "${M}cmdline"; tr '\0' '\n' < "/proc/$pid/cmdline"; echo; echo "${M}end"
if env=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null); then
  echo "${M}environ"; printf '%s\n' "$env"; echo "${M}end"
fi
exit 0
"""


@dataclass(frozen=True)
class NodeView:
    #: path -> content of the instance's deployed files (absent: not on the node)
    files: dict[str, str] = field(default_factory=dict)
    running: RunningServer | None = None


def command_file_path(instance: Instance, sup: supervisor.Supervisor) -> str:
    return unit_path(instance) if sup == "systemd" else supervisor.run_file_path(instance)


def parse_inspect(out: str) -> NodeView:
    sections: dict[str, list[str]] = {}
    pid: int | None = None
    current: list[str] | None = None
    for line in out.split("\n"):
        if line.startswith(_MARK):
            word, _, arg = line[len(_MARK) :].partition(" ")
            if word in ("file", "cmdline", "environ"):
                current = sections.setdefault(f"file {arg}" if word == "file" else word, [])
            elif word == "pid" and arg.isdigit():
                pid, current = int(arg), None
            else:  # end
                current = None
            continue
        if current is not None:
            current.append(line)
    # the script echoes a newline after each file, so joining the lines gives the file back exactly
    files = {key[5:]: "\n".join(lines) for key, lines in sections.items() if key.startswith("file ")}
    running = None
    if pid is not None and "cmdline" in sections:
        argv = [a for a in sections["cmdline"] if a]
        environ = None
        if "environ" in sections:
            environ = dict(e.split("=", 1) for e in sections["environ"] if "=" in e)
        running = RunningServer(pid, argv, environ)
    return NodeView(files, running)


def inspect(conn: Connector, instance: Instance, sup: supervisor.Supervisor, *, sudo: bool) -> NodeView:
    """Read the instance's deployed files and its running process. `sudo`: the env file is root-only
    (0600) and the server may run as another user."""
    who = unit_name(instance) if sup == "systemd" else pid_file_path(instance)
    res = conn.run(
        Command("sh", "-c", _INSPECT, "inferctl", env_file_path(instance), command_file_path(instance, sup), sup, who),
        sudo=sudo,
        timeout=30,
    )
    return parse_inspect(res.out)
