"""Which port of each HCA takes part in the pair tests, the address a client reaches its server at, and
the path MTU and link rate of one pair.

The client of a pair test exchanges QP numbers with its server over TCP before any RDMA traffic, so it
needs an address of the server that resolves and routes *from the client*. The profile's `host` is the
controller's way in (it may be a ~/.ssh/config alias, a jump host's view, a management network): the
client gets the server's data-plane address instead, the IPv4 of the RoCE v2 GID the test uses (an
IPv4-mapped GID `::ffff:a.b.c.d` is the RoCE netdev's address), else the host name ~/.ssh/config resolves
the node to (HostName), else the profile's host.
"""

from __future__ import annotations

import ipaddress
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
    #: where `endpoint.host` came from: "gid" (the RoCE v2 GID's IPv4) | "ssh_config" (HostName) | "profile"
    address_source: str = "profile"


def gid_ipv4(gid: str) -> str | None:
    """'::ffff:10.0.0.11' (or the sysfs form 0000:...:ffff:0a00:000b) -> '10.0.0.11'; None otherwise."""
    try:
        mapped = ipaddress.IPv6Address(gid.strip()).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


def node_endpoints(
    node: Node, facts: NodeFabricFacts, exp: FabricExpectations, resolved_host: str | None = None
) -> list[EndpointInfo]:
    """ACTIVE ports of the checked devices with a usable GID (RoCE v2) or on InfiniBand, in device order,
    each with the address clients reach it at (module docstring). `resolved_host`: the node's host after
    ~/.ssh/config (HostName), when it differs from the profile's."""
    fallback, fallback_source = (resolved_host, "ssh_config") if resolved_host and resolved_host != node.host \
        else (node.host, "profile")
    out = []
    present = set(facts.device_names())
    for dev in checked_devices(facts, exp):
        if dev not in present:
            continue
        for v in port_views(facts, dev):
            if not v.active:
                continue
            gid, address, source = None, fallback, fallback_source
            if v.roce:
                choice = gid_choice(v, exp.gid_index, exp.policy.gid_family)
                if choice is None or choice.roce_version != 2:
                    continue
                gid = choice.index
                if (ipv4 := gid_ipv4(choice.gid)) is not None:
                    address, source = ipv4, "gid"
            out.append(EndpointInfo(Endpoint(node.name, address, dev, gid, v.port), v.active_mtu, v.rate_gbps, source))
            break  # one port per device: the first active one
    return out


def path_mtu(profile_mtu: int, a: EndpointInfo, b: EndpointInfo) -> int:
    """The -m of a pair: the smallest of the profile's RoCE MTU and both active MTUs (1024 if none known)."""
    return min([m for m in (profile_mtu, a.active_mtu, b.active_mtu) if m] or [1024])


def slower_rate(a: EndpointInfo, b: EndpointInfo) -> float | None:
    """The slower link of a pair in Gb/s, for the bandwidth target; None when neither rate is known."""
    rates = [r for r in (a.rate_gbps, b.rate_gbps) if r]
    return min(rates) if rates else None
