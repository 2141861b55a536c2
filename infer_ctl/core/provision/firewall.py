"""Parsing firewall state (ufw, firewalld) and deciding which ports are missing. Pure."""

from __future__ import annotations

import re


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


def firewalld_ports(list_ports_text: str) -> set[str]:
    """`firewall-cmd --list-ports` output (`30000/tcp 15000-17000/tcp`) in ufw notation."""
    return {p.replace("-", ":") for p in list_ports_text.split()}


def missing_ports(wanted: list[str], allowed: set[str]) -> list[str]:
    return [p for p in wanted if p not in allowed]
