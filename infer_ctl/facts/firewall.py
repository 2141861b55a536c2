"""Host firewall state, read-only: ufw (`ufw status`) and firewalld (`firewall-cmd --state`,
`--list-ports`). Port specs come back in ufw's notation (`30000/tcp`, `15000:17000/tcp`), which is also
the notation of core.provision.desired.firewall_ports."""

from __future__ import annotations

import re

from infer_ctl.remote.base import Command

UFW_PRESENT = Command("sh", "-c", "command -v ufw")
UFW_STATUS = Command("ufw", "status")
FIREWALLD_STATE = Command("firewall-cmd", "--state")
FIREWALLD_LIST_PORTS = Command("firewall-cmd", "--list-ports")


def ufw_active(status_text: str) -> bool:
    return bool(re.search(r"^Status:\s*active", status_text, re.MULTILINE))


def ufw_allowed(status_text: str) -> set[str]:
    """Port specs with an ALLOW rule, in ufw's own notation (`30000/tcp`, `15000:17000/tcp`)."""
    allowed = set()
    for line in status_text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and "ALLOW" in parts[1:3] and "(v6)" not in parts[:2]:
            allowed.add(parts[0])
    return allowed


def firewalld_running(state_text: str) -> bool:
    return state_text.strip() == "running"


def firewalld_ports(list_ports_text: str) -> set[str]:
    """`firewall-cmd --list-ports` output (`30000/tcp 15000-17000/tcp`) in ufw notation."""
    return {p.replace("-", ":") for p in list_ports_text.split()}
