"""fabric.link_flaps over the fleet: one small command per node (facts/link_flaps.py), judged with what
earlier audits remembered (core/fabric/link_flaps.py). Run by the fabric family (checks/fabric.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from infer_ctl.core.fabric.link_flaps import judge_link_flaps
from infer_ctl.core.findings import Finding
from infer_ctl.facts.link_flaps import flaps_command, parse_flaps_output
from infer_ctl.profile import Node, Profile

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet


def check_link_flaps(profile: Profile, fleet: Fleet, nodes: Sequence[Node],
                     memory: Mapping[str, Any] | None = None) -> list[Finding]:
    """Nodes the fabric gatherer could not reach are skipped here (their fabric.node finding says so)."""
    mine = (memory or {}).get("fabric.link_flaps") or {}

    def read(conn: Any, node: Node) -> Finding | list[Finding]:
        window = profile.fabric_policy_for(node).flap_window_h
        res = conn.run(flaps_command(window), timeout=30)
        log = parse_flaps_output(res.out, window)
        previous = mine.get(node.name) if isinstance(mine, Mapping) else None
        return judge_link_flaps(node.name, log, previous if isinstance(previous, Mapping) else None)

    out: list[Finding] = []
    for o in fleet.map(list(nodes), read):
        if isinstance(o.value, list):
            out.extend(o.value)
    return out
