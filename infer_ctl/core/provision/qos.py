"""RoCE QoS desired state (trust, PFC on one priority, ECN) and the `mlnx_qos -i <if>` fields it needs."""

from __future__ import annotations

import re


def parse_trust(mlnx_qos_text: str) -> str | None:
    match = re.search(r"^Priority trust state:\s*(\w+)", mlnx_qos_text, re.MULTILINE)
    return match.group(1) if match else None


def parse_pfc_enabled(mlnx_qos_text: str) -> tuple[int, ...] | None:
    """The 8 PFC enable flags from the `enabled` row of the PFC table."""
    match = re.search(r"^\s*enabled\s+((?:[01]\s+){7}[01])", mlnx_qos_text, re.MULTILINE)
    return tuple(int(x) for x in match.group(1).split()) if match else None


def desired_pfc(priority: int) -> tuple[int, ...]:
    return tuple(1 if p == priority else 0 for p in range(8))


def pfc_arg(flags: tuple[int, ...]) -> str:
    return ",".join(str(f) for f in flags)
