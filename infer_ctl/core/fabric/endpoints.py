"""Which port of each HCA takes part in the pair tests, and the path MTU and link rate of one pair."""

from __future__ import annotations

from dataclasses import dataclass

from infer_ctl.core.fabric.expectations import FabricExpectations
from infer_ctl.core.fabric.facts import NodeFabricFacts
from infer_ctl.core.fabric.pairs import Endpoint
from infer_ctl.core.fabric.rules import checked_devices, gid_choice, port_views
from infer_ctl.profile import Node


@dataclass(frozen=True)
class EndpointInfo:
    endpoint: Endpoint
    active_mtu: int | None
    rate_gbps: float | None


def node_endpoints(node: Node, facts: NodeFabricFacts, exp: FabricExpectations) -> list[EndpointInfo]:
    """ACTIVE ports of the checked devices with a usable GID (RoCE v2) or on InfiniBand, in device order."""
    out = []
    present = set(facts.device_names())
    for dev in checked_devices(facts, exp):
        if dev not in present:
            continue
        for v in port_views(facts, dev):
            if not v.active:
                continue
            gid = None
            if v.roce:
                choice = gid_choice(v, exp.gid_index, exp.policy.gid_family)
                if choice is None or choice.roce_version != 2:
                    continue
                gid = choice.index
            out.append(EndpointInfo(Endpoint(node.name, node.host, dev, gid, v.port), v.active_mtu, v.rate_gbps))
            break  # one port per device: the first active one
    return out


def path_mtu(profile_mtu: int, a: EndpointInfo, b: EndpointInfo) -> int:
    """The -m of a pair: the smallest of the profile's RoCE MTU and both active MTUs (1024 if none known)."""
    return min([m for m in (profile_mtu, a.active_mtu, b.active_mtu) if m] or [1024])


def slower_rate(a: EndpointInfo, b: EndpointInfo) -> float | None:
    """The slower link of a pair in Gb/s, for the bandwidth target; None when neither rate is known."""
    rates = [r for r in (a.rate_gbps, b.rate_gbps) if r]
    return min(rates) if rates else None
