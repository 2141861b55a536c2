"""Where each SGLang server port of a node comes from, so a clash names the fields the user wrote.

A node's port is its override (`nodes[i].overrides.<x>_port`) or the fleet-wide `sglang.<role>.*`, which
the profile may set or leave at its default; a clash blamed on an override nobody wrote sent users
looking for a key that was not in their file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infer_ctl.profile.nodes import Node, Role

if TYPE_CHECKING:
    from infer_ctl.profile.sglang import SglangSettings

Loc = tuple[str | int, ...]

#: the NodeOverrides key of each server (a collocated server's is prefill_port)
OVERRIDE_KEY = {"prefill": "prefill_port", "bootstrap": "bootstrap_port", "decode": "decode_port",
                "collocated": "prefill_port"}


@dataclass(frozen=True)
class PortSource:
    port: int
    loc: Loc  # the field that set it
    written: bool  # in the profile (an override or a set sglang field), not a default

    @property
    def field(self) -> str:
        out = ""
        for part in self.loc:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out


def _pick(i: int, override: int | None, ov_key: str, sglang: SglangSettings, role: str, key: str) -> PortSource:
    if override:
        return PortSource(override, ("nodes", i, "overrides", ov_key), True)
    section = getattr(sglang, role)
    return PortSource(getattr(section, key), ("sglang", role, key),
                      role in sglang.model_fields_set and key in section.model_fields_set)


def port_sources(i: int, node: Node, sglang: SglangSettings, collocated: bool) -> dict[str, PortSource]:
    """The HTTP (and bootstrap) ports node `i`'s SGLang servers listen on, by role, with their source."""
    ov = node.overrides
    if collocated:  # a collocated server's override is prefill_port (NodeOverrides has no other)
        return {"collocated": _pick(i, ov.prefill_port, OVERRIDE_KEY["collocated"], sglang, "collocated", "port")}
    ports: dict[str, PortSource] = {}
    if node.has_role(Role.PREFILL):
        ports["prefill"] = _pick(i, ov.prefill_port, "prefill_port", sglang, "prefill", "port")
        ports["bootstrap"] = _pick(i, ov.bootstrap_port, "bootstrap_port", sglang, "prefill", "bootstrap_port")
    if node.has_role(Role.DECODE):
        ports["decode"] = _pick(i, ov.decode_port, "decode_port", sglang, "decode", "port")
    return ports


def describe(src: PortSource) -> str:
    return src.field if src.written else f"the default {src.field} {src.port}"


def clash_loc(i: int, src: PortSource, other: PortSource, same_node: bool) -> Loc:
    """The field to blame: this port's override if written; two nodes on one host: this node's host
    (the user wrote it; the fix is another host or an override); else the sglang field."""
    if src.loc[0] == "nodes" or same_node:
        return src.loc if src.written or not other.written else other.loc
    return ("nodes", i, "host")
