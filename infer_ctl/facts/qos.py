"""RoCE QoS facts of a netdev: PFC per priority and trust mode (`mlnx_qos` or `dcb`), global pause
(`ethtool -a`). Formats: ../shared/reference/health-checks.md §2.5-2.7.

`mlnx_qos` (MLNX_OFED mlnx-tools) is preferred when installed because it shows PFC and trust in one
call; upstream systems have iproute2's `dcb` instead (`dcb -j pfc show` + `dcb apptrust show`, or the
DSCP APP table when apptrust is too old).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.remote.base import Command


def mlnx_qos_command(netdev: str) -> Command:
    return Command("mlnx_qos", "-i", netdev)


def dcb_pfc_command(netdev: str) -> Command:
    return Command("dcb", "-j", "pfc", "show", "dev", netdev)


def dcb_apptrust_command(netdev: str) -> Command:
    return Command("dcb", "apptrust", "show", "dev", netdev)


def dcb_app_command(netdev: str) -> Command:
    return Command("dcb", "app", "show", "dev", netdev, "dscp-prio")


def ethtool_pause_command(netdev: str) -> Command:
    return Command("ethtool", "--json", "-a", netdev)


def ethtool_pause_text_command(netdev: str) -> Command:
    return Command("ethtool", "-a", netdev)


@dataclass
class QosFacts:
    #: which tool the facts came from: "mlnx_qos" | "dcb"
    source: str
    #: PFC enabled per priority 0..7 (None when the tool did not show it)
    pfc: list[bool] | None = None
    trust: str | None = None  # "dscp" | "pcp"
    dcbx_mode: str | None = None
    #: DSCP -> priority, when shown (mlnx_qos dscp2prio, dcb app dscp-prio)
    dscp2prio: dict[int, int] = field(default_factory=dict)

    @property
    def pfc_priorities(self) -> list[int]:
        return [i for i, on in enumerate(self.pfc or []) if on]


@dataclass(frozen=True)
class PauseFacts:
    autoneg: bool | None
    rx: bool
    tx: bool


class QosParseError(ValueError):
    pass


_PFC_ENABLED = re.compile(r"^\s*enabled\s+((?:[01]\s*){8})")


def parse_mlnx_qos(text: str) -> QosFacts:
    facts = QosFacts("mlnx_qos")
    prio: int | None = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("DCBX mode:"):
            facts.dcbx_mode = s.split(":", 1)[1].strip()
        elif s.startswith("Priority trust state:") or s.startswith("Priority trust mode:"):
            facts.trust = s.split(":", 1)[1].strip().lower()
        elif m := re.match(r"^prio:(\d)\s+dscp:([\d,]*)", s):
            prio = int(m.group(1))
            for d in m.group(2).split(","):
                if d.strip():
                    facts.dscp2prio[int(d)] = prio
        elif m := _PFC_ENABLED.match(line):
            facts.pfc = [c == "1" for c in m.group(1).split()]
    if facts.pfc is None and facts.trust is None:
        raise QosParseError("mlnx_qos output has neither a PFC table nor a trust state")
    return facts


def parse_dcb_pfc_json(text: str) -> list[bool]:
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise QosParseError(f"dcb -j pfc show: not JSON ({exc.msg})") from exc
    if isinstance(doc, list):  # some iproute2 versions wrap objects in a list
        doc = doc[0] if doc else {}
    prio = doc.get("prio_pfc") if isinstance(doc, dict) else None
    if isinstance(prio, dict):  # {"0": false, ...}
        return [bool(prio.get(str(i), False)) for i in range(8)]
    if not isinstance(prio, list) or len(prio) != 8:
        raise QosParseError("dcb -j pfc show: no 8-entry prio_pfc array")
    return [bool(v) for v in prio]


def parse_dcb_pfc_text(text: str) -> list[bool]:
    """`prio-pfc 0:off 1:off ... 7:on` (pre-release iproute2 printed `pg-pfc`)."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] in ("prio-pfc", "pg-pfc"):
            values = dict(w.split(":", 1) for w in words[1:] if ":" in w)
            return [values.get(str(i)) == "on" for i in range(8)]
    raise QosParseError("dcb pfc show: no prio-pfc line")


def parse_dcb_pfc(text: str) -> list[bool]:
    return parse_dcb_pfc_json(text) if text.lstrip().startswith(("{", "[")) else parse_dcb_pfc_text(text)


def parse_dcb_apptrust(text: str) -> str | None:
    """`order: dscp pcp` -> "dscp" (the first selector wins); None for an empty order."""
    for line in text.splitlines():
        if line.strip().startswith("order:"):
            order = line.split(":", 1)[1].split()
            return order[0].lower() if order else None
    return None


def parse_dcb_app_dscp(text: str) -> dict[int, int]:
    """`dscp-prio 0:0 CS3:3 26:3` -> {0: 0, 24: 3, 26: 3} (CSn = n*8)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "dscp-prio":
            continue
        for w in words[1:]:
            key, _, prio = w.partition(":")
            dscp = int(key[2:]) * 8 if key.upper().startswith("CS") else _int(key)
            p = _int(prio)
            if dscp is not None and p is not None:
                out[dscp] = p
    return out


def _int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def _onoff(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        return {"on": True, "off": False}.get(value.strip().lower())
    return None


def parse_ethtool_pause(text: str) -> PauseFacts:
    """`ethtool --json -a` or plain `ethtool -a`."""
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            doc: Any = json.loads(text)
        except json.JSONDecodeError as exc:
            raise QosParseError(f"ethtool --json -a: not JSON ({exc.msg})") from exc
        if isinstance(doc, list):
            doc = doc[0] if doc else {}
        rx, tx = _onoff(doc.get("rx")), _onoff(doc.get("tx"))
        if rx is None or tx is None:
            raise QosParseError("ethtool --json -a: no rx/tx keys")
        return PauseFacts(_onoff(doc.get("autonegotiate")), rx, tx)
    values: dict[str, bool | None] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("Autonegotiate", "RX", "TX"):
            values[key.strip()] = _onoff(value)
    if values.get("RX") is None or values.get("TX") is None:
        raise QosParseError("ethtool -a: no RX/TX lines")
    return PauseFacts(values.get("Autonegotiate"), bool(values["RX"]), bool(values["TX"]))
