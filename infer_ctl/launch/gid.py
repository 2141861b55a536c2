"""The RoCE GID index a server's Mooncake transfers use (MC_GID_INDEX), read from the node at launch.

Mooncake picks GID index 3 when MC_GID_INDEX is unset; the index of the RoCE v2 GID carrying the node's
address is not 3 everywhere (it depends on the NIC and on the addresses configured), and a wrong one
shows only as failed transfers. So unless the profile pins `nodes[].rdma.gid_index`, launch reads the
GID tables of the HCAs the server is given (`--disaggregation-ib-device`, else every HCA on the node)
from sysfs and chooses as `inferctl check fabric` does (perftest's scoring, `core/fabric/gid.py`): a
RoCE v2 GID of the profile's address family (`fabric.gid_family`), not link-local when a global one
exists. InfiniBand ports need no GID index. On RoCE, an index that cannot be determined (a configured
HCA missing, no ACTIVE port, no RoCE v2 GID of that family, HCAs disagreeing) is a FAIL: the server is
not started.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infer_ctl.core.fabric.facts import NodeFabricFacts
from infer_ctl.core.fabric.gid import Family
from infer_ctl.core.fabric.rules import gid_choice, port_views
from infer_ctl.core.sglang import Instance
from infer_ctl.core.sglang.argv import sglang_ib_devices
from infer_ctl.facts.rdma_sysfs import parse_sysfs_dump, sysfs_command, sysfs_root_for
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Connector


@dataclass(frozen=True)
class GidDecision:
    #: what MC_GID_INDEX says (None: not rendered)
    index: int | None
    #: why it cannot be determined on RoCE (the server is refused)
    error: str | None = None
    #: how it was chosen, for the launch results
    detail: str = ""


def needs_probe(profile: Profile, node: Node, inst: Instance) -> bool:
    """Mooncake over RDMA, a PD server, and no index pinned in the profile."""
    if profile.sglang.transfer_backend != "mooncake" or inst.role not in ("prefill", "decode"):
        return False
    return node.rdma is None or node.rdma.gid_index is None


def decide(facts: NodeFabricFacts, devices: Sequence[str], prefer: Family) -> GidDecision:
    """Pure: the index every RoCE HCA of the server agrees on, from the node's sysfs facts."""
    present = facts.device_names()
    wanted = list(devices) or present
    if not wanted:
        # no HCA configured and none found: nothing tells RoCE from InfiniBand here (`check fabric`
        # reports a node without RDMA devices)
        return GidDecision(None, None, "no RDMA device found on the node")
    chosen: dict[str, int] = {}
    for dev in wanted:
        if dev not in present:
            return GidDecision(None, f"HCA {dev} is not on the node (no /sys/class/infiniband/{dev}): "
                               "its GID table cannot be read")  # fmt: skip
        active = [v for v in port_views(facts, dev) if v.active]
        if not active:
            return GidDecision(None, f"HCA {dev} has no ACTIVE port: no GID to choose")
        v = active[0]
        if not v.roce:
            continue  # InfiniBand: addressed by LID
        choice = gid_choice(v, None, prefer)
        if choice is None or choice.roce_version != 2 or choice.family != prefer:
            return GidDecision(None, f"{v.subject} has no RoCE v2 {prefer} GID (GID table: "
                               f"{len(v.gids)} entries)")  # fmt: skip
        chosen[v.subject] = choice.index
    if not chosen:
        return GidDecision(None, None, "InfiniBand: no GID index needed")
    indexes = sorted(set(chosen.values()))
    if len(indexes) > 1:
        per = ", ".join(f"{k}: {i}" for k, i in sorted(chosen.items()))
        return GidDecision(None, f"the HCAs choose different GID indexes ({per}); MC_GID_INDEX is one "
                           "value per server")  # fmt: skip
    return GidDecision(indexes[0], None, f"GID index {indexes[0]} (RoCE v2, {prefer}) on {', '.join(sorted(chosen))}")


def probe(conn: Connector, profile: Profile, node: Node, inst: Instance) -> GidDecision:
    """Read the node's GID tables and decide; a pinned `nodes[].rdma.gid_index` is used as is."""
    if node.rdma is not None and node.rdma.gid_index is not None:
        return GidDecision(node.rdma.gid_index, None, "nodes[].rdma.gid_index")
    res = conn.run(sysfs_command(root=sysfs_root_for(node.name)), timeout=30)
    devices = sglang_ib_devices(profile, inst)
    if not res.ok:
        if devices:
            return GidDecision(None, f"cannot read the GID tables (sysfs gatherer exit {res.exit_code})")
        return GidDecision(None, None, "sysfs not readable; no HCA configured")
    facts = NodeFabricFacts(node.name, sysfs=parse_sysfs_dump(res.out))
    return decide(facts, devices, profile.fabric_policy_for(node).gid_family)
