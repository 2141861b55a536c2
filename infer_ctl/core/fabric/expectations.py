"""What the profile expects of one node's fabric: the devices and netdev to check, the GID index, the
HCAs SGLang is told to use, and whether the node needs RDMA at all."""

from __future__ import annotations

from dataclasses import dataclass

from infer_ctl.core.sglang.argv import sglang_ib_devices
from infer_ctl.core.sglang.instance import instances
from infer_ctl.errors import ProfileError
from infer_ctl.profile import Node, Profile, Role
from infer_ctl.profile.fabric import FabricPolicy


@dataclass(frozen=True)
class FabricExpectations:
    policy: FabricPolicy
    #: nodes[].rdma.devices; empty means "every device found"
    devices: tuple[str, ...] = ()
    netdev: str | None = None
    #: nodes[].rdma.gid_index; None means "choose like perftest"
    gid_index: int | None = None
    #: the HCAs SGLang is given via --disaggregation-ib-device on this node (core.sglang.argv.sglang_ib_devices)
    sglang_ib_devices: tuple[str, ...] = ()
    #: False for nodes that need no RDMA (collocated, TCP transfer); missing devices are then skipped
    needs_rdma: bool = True


def expectations(profile: Profile, node: Node) -> FabricExpectations:
    rdma = node.rdma
    needs = not profile.collocated and profile.sglang.transfer_backend != "mooncake_tcp"
    return FabricExpectations(
        policy=profile.fabric_policy_for(node),
        devices=tuple(rdma.devices) if rdma else (),
        netdev=rdma.netdev if rdma else None,
        gid_index=rdma.gid_index if rdma else None,
        sglang_ib_devices=node_sglang_ib_devices(profile, node),
        needs_rdma=needs and (node.has_role(Role.PREFILL) or node.has_role(Role.DECODE)),
    )


def node_sglang_ib_devices(profile: Profile, node: Node) -> tuple[str, ...]:
    """The HCAs of every SGLang server on the node, from the same argv `inferctl launch` renders."""
    try:
        mine = [i for i in instances(profile) if i.node == node.name]
    except ProfileError:
        # The servers cannot be laid out (tp*dp against the GPUs): there is no command line to take the
        # devices from; `inferctl launch --dry-run` and `check servers` report why.
        return ()
    return tuple(dict.fromkeys(name for inst in mine for name in sglang_ib_devices(profile, inst)))
