"""RoCE QoS facts of a netdev: PFC per priority and trust mode (`mlnx_qos` or `dcb`), global pause
(`ethtool -a`). Formats: mlnx_qos's `pretty_print()` (Mellanox mlnx-tools, python/mlnx_qos), iproute2
`dcb` (dcb/ and dcb-pfc(8), dcb-app(8), dcb-apptrust(8)), ethtool's `-a`/`--json -a`/`-S` output;
summarised with versions in docs/reference/tool-output-formats.md.

`mlnx_qos` (MLNX_OFED mlnx-tools) is preferred when installed because it shows PFC and trust in one
call; upstream systems have iproute2's `dcb` instead (`dcb -j pfc show` + `dcb apptrust show`, or the
DSCP APP table when apptrust is too old).
"""

from __future__ import annotations

import json
import re
from typing import Any

from infer_ctl.core.fabric.facts import PRIO_PAUSE_COUNTER, PauseFacts, QosFacts
from infer_ctl.remote.base import Command


def mlnx_qos_command(netdev: str) -> Command:
    return Command("mlnx_qos", "-i", netdev)


def dcb_pfc_command(netdev: str) -> Command:
    return Command("dcb", "-j", "pfc", "show", "dev", netdev)


def dcb_apptrust_command(netdev: str) -> Command:
    return Command("dcb", "apptrust", "show", "dev", netdev)


def dcb_app_command(netdev: str) -> Command:
    # -N (iproute2 5.12, the release that added `dcb app`): numeric DSCP values instead of the names
    # of /etc/iproute2/rt_dsfield (AF31 for 26, the usual RoCE DSCP), which can be renamed locally.
    return Command("dcb", "-N", "app", "show", "dev", netdev, "dscp-prio")


def ethtool_pause_command(netdev: str) -> Command:
    return Command("ethtool", "--json", "-a", netdev)


def ethtool_pause_text_command(netdev: str) -> Command:
    return Command("ethtool", "-a", netdev)


def ethtool_stats_command(netdev: str) -> Command:
    return Command("ethtool", "-S", netdev)


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
            # mlnx_qos prints "none" after "Priority trust state is not supported on your system"
            trust = s.split(":", 1)[1].strip().lower()
            facts.trust = trust if trust in ("dscp", "pcp") else None
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


def dscp_value(name: str) -> int | None:
    """A DSCP as `dcb app` prints it: a number (-N), or an iproute2 rt_dsfield name (CS3, AF31, EF, default)."""
    key = name.strip().upper()
    if m := re.fullmatch(r"CS([0-7])", key):
        return int(m.group(1)) * 8
    if m := re.fullmatch(r"AF([1-4])([1-3])", key):  # RFC 2597: class x, drop precedence y
        return int(m.group(1)) * 8 + int(m.group(2)) * 2
    return {"EF": 46, "DEFAULT": 0}.get(key, _int(key))


def parse_dcb_app_dscp(text: str) -> dict[int, int]:
    """`dscp-prio 0:0 CS3:3 AF31:3 26:3` -> {0: 0, 24: 3, 26: 3}."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] != "dscp-prio":
            continue
        for w in words[1:]:
            key, _, prio = w.rpartition(":")
            dscp, p = dscp_value(key), _int(prio)
            if dscp is not None and p is not None:
                out[dscp] = p
    return out


def _int(s: str) -> int | None:
    try:
        return int(s)
    except ValueError:
        return None


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """`ethtool -S` (`NIC statistics:` then `     name: value` lines) -> {name: value}."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if sep and (n := _int(value.strip())) is not None:
            out[key.strip()] = n
    return out


def prio_pause_counters(stats: dict[str, int]) -> dict[str, int]:
    """The per-priority PFC pause frame counters (mlx5 `rx_prio3_pause`, `tx_prio3_pause`, ...)."""
    return {k: v for k, v in stats.items() if PRIO_PAUSE_COUNTER.match(k)}


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
