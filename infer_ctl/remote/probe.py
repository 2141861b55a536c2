"""What `inferctl nodes` learns about each node: one round trip for identity/OS facts, one for sudo.

The probe is a command plus a pure parser, like the facts/ modules, so the parser is tested on text.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from infer_ctl.profile import Node
from infer_ctl.remote.base import Command, Connector
from infer_ctl.remote.errors import SudoError

NODE_PROBE = Command.sh(
    'echo "user=$(id -un)"; echo "uid=$(id -u)"; '
    '( . /etc/os-release 2>/dev/null && echo "os=${PRETTY_NAME:-$NAME}" ); '
    'echo "kernel=$(uname -r)"; echo "arch=$(uname -m)"; '
    'echo "python3=$(python3 -V 2>&1)"; '
    "echo \"uptime_s=$(cut -d' ' -f1 /proc/uptime 2>/dev/null)\""
)

_PYTHON = re.compile(r"^Python (\d+\.\d+(?:\.\d+)?\S*)$")


@dataclass(frozen=True)
class NodeInfo:
    node: str
    host: str
    reachable: bool
    connect_s: float | None = None
    user: str | None = None
    sudo: str | None = None  # "yes", "root", "not used", or why not
    os: str | None = None
    kernel: str | None = None
    arch: str | None = None
    python3: str | None = None
    uptime_s: float | None = None
    error: str | None = None
    remedy: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_node_probe(text: str) -> dict[str, Any]:
    """key=value lines -> typed facts; missing or odd values become None, never an exception."""
    raw: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            raw[key.strip()] = value.strip()
    python = _PYTHON.match(raw.get("python3", ""))
    try:
        uptime: float | None = float(raw["uptime_s"])
    except (KeyError, ValueError):
        uptime = None
    return {
        "user": raw.get("user") or None,
        "uid": int(raw["uid"]) if raw.get("uid", "").isdigit() else None,
        "os": raw.get("os") or None,
        "kernel": raw.get("kernel") or None,
        "arch": raw.get("arch") or None,
        "python3": python.group(1) if python else None,
        "uptime_s": uptime,
    }


def sudo_status(conn: Connector, *, sudo_enabled: bool, uid: int | None) -> str:
    # root needs no sudo (privileged commands run as themselves), whether or not the node has sudo
    if uid == 0:
        return "root"
    if not sudo_enabled:
        return "not used (ssh.sudo: false)"
    try:
        result = conn.run(Command("true"), sudo=True, timeout=15)
    except SudoError as exc:
        return f"no: {exc.message.split(': ', 1)[-1]}"
    return "yes" if result.ok else f"no: exit {result.exit_code}"


def probe_node(conn: Connector, node: Node, *, sudo_enabled: bool, connect_s: float) -> NodeInfo:
    result = conn.run(NODE_PROBE, timeout=30)
    facts = parse_node_probe(result.out)
    sudo = sudo_status(conn, sudo_enabled=sudo_enabled, uid=facts["uid"])
    return NodeInfo(
        node=node.name,
        host=node.host,
        reachable=True,
        connect_s=round(connect_s, 3),
        user=facts["user"],
        sudo=sudo,
        os=facts["os"],
        kernel=facts["kernel"],
        arch=facts["arch"],
        python3=facts["python3"],
        uptime_s=facts["uptime_s"],
    )
