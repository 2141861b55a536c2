"""Fabric rules: one function per check id, each judging gathered facts against the profile.

Check ids: fabric.devices, fabric.port_state, fabric.rate, fabric.link_layer, fabric.mtu, fabric.gid,
fabric.netdev_mtu, fabric.pfc, fabric.trust, fabric.ecn, fabric.pause, fabric.counters,
fabric.sglang_ib_device, fabric.nic_pcie (per node) and fabric.gid_family (across nodes). The QoS rules apply to
RoCE (Ethernet link layer) only.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infer_ctl.core.fabric.expectations import FabricExpectations
from infer_ctl.core.fabric.facts import GidEntry, NetdevFacts, NicPcie, NodeFabricFacts, pause_priority
from infer_ctl.core.fabric.gid import Family, GidChoice, choose_gid, describe
from infer_ctl.core.findings import Finding
from infer_ctl.profile.fabric import FabricPolicy

# iboe_get_mtu(): the RoCE MTU is what fits in the netdev MTU after GRH+UDP+BTH+XRC+AtomicETH+ICRC.
ROCE_HEADER_BYTES = 96
INSTALL_RDMA_CORE = "install rdma-core and ibverbs-utils (Debian/Ubuntu: apt-get install rdma-core ibverbs-utils; RHEL: dnf install rdma-core libibverbs-utils)"
INSTALL_QOS_TOOL = "install mlnx_qos (MLNX_OFED / mlnx-tools) or iproute2 >= 5.11 for `dcb` (apt-get install iproute2)"
#: counters whose growth means trouble; link_downed is a failure, the rest warnings
ERROR_COUNTERS = (
    "link_downed", "symbol_error", "link_error_recovery", "port_rcv_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "out_of_sequence", "packet_seq_err", "rnr_nak_retry_err",
    "local_ack_timeout_err", "implied_nak_seq_err",
)
CONGESTION_COUNTERS = ("np_cnp_sent", "rp_cnp_handled", "np_ecn_marked_roce_packets", "rp_cnp_ignored")


@dataclass
class PortView:
    """One HCA port, merged from sysfs (preferred) and ibv_devinfo (fills gaps, gives active MTU)."""

    device: str
    port: int
    state: str | None = None
    phys_state: str | None = None
    rate_gbps: float | None = None
    rate_text: str | None = None
    link_layer: str | None = None
    active_mtu: int | None = None
    gids: list[GidEntry] = field(default_factory=list)
    #: the netdev(s) behind the port (RoCE), for messages and remedies
    netdevs: list[str] = field(default_factory=list)

    @property
    def subject(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state in ("LinkUp", None)

    @property
    def roce(self) -> bool:
        return self.link_layer == "Ethernet"


_DEVINFO_STATE = {"PORT_ACTIVE": "ACTIVE", "PORT_DOWN": "DOWN", "PORT_INIT": "INIT", "PORT_ARMED": "ARMED"}
_DEVINFO_PHYS = {"LINK_UP": "LinkUp", "DISABLED": "Disabled", "POLLING": "Polling", "SLEEP": "Sleep"}


def _devinfo_rate(width: str | None, speed: str | None) -> float | None:
    w = re.match(r"(\d+)X", width or "")
    s = re.match(r"([\d.]+)\s*Gbps", speed or "")
    return int(w.group(1)) * float(s.group(1)) if w and s else None


def port_views(facts: NodeFabricFacts, device: str) -> list[PortView]:
    views: dict[int, PortView] = {}
    for p in facts.sysfs_ports(device):
        views[p.port] = PortView(device, p.port, p.state, p.phys_state, p.rate_gbps, p.rate_text, p.link_layer,
                                 gids=list(p.gids))
    for lk in facts.links or []:
        if lk.device == device:
            v = views.setdefault(lk.port, PortView(device, lk.port))
            v.state = v.state or lk.state
            v.phys_state = v.phys_state or _DEVINFO_PHYS.get(lk.physical_state or "", lk.physical_state)
    for d in facts.devinfo or []:
        if d.name != device:
            continue
        for n, dp in d.ports.items():
            v = views.setdefault(n, PortView(device, n))
            v.active_mtu = dp.active_mtu
            v.state = v.state or _DEVINFO_STATE.get(dp.state or "", dp.state)
            v.phys_state = v.phys_state or _DEVINFO_PHYS.get(dp.phys_state or "", dp.phys_state)
            v.link_layer = v.link_layer or dp.link_layer
            v.rate_gbps = v.rate_gbps or _devinfo_rate(dp.active_width, dp.active_speed)
            if not v.gids:
                v.gids = list(dp.gids)
    netdevs = facts.netdevs_of(device)
    for v in views.values():
        v.netdevs = list(netdevs)
    return [views[k] for k in sorted(views)]


def _netdev_words(v: PortView) -> str:
    return "/".join(v.netdevs) if v.netdevs else "the netdev behind this HCA"


def checked_devices(facts: NodeFabricFacts, exp: FabricExpectations) -> list[str]:
    return list(exp.devices) if exp.devices else facts.device_names()


# ---- per-node rules ------------------------------------------------------------------------------
def judge_presence(facts: NodeFabricFacts, exp: FabricExpectations) -> list[Finding]:
    node, found = facts.node, facts.device_names()
    if not found:
        why = facts.devinfo_error.message if facts.devinfo_error else (facts.sysfs_error or "no /sys/class/infiniband")
        if not exp.needs_rdma and not exp.devices:
            return [Finding.skip("fabric.devices", node, "rdma", f"no RDMA device and none needed ({why})")]
        not_installed = facts.devinfo_error is not None and facts.devinfo_error.kind == "not-installed"
        expected = f" (expected {', '.join(exp.devices)})" if exp.devices else ""
        return [Finding.fail(
            "fabric.devices", node, "rdma", f"no RDMA device found{expected}: {why}",
            details={"expected": list(exp.devices), "devinfo_error": why},
            remedy=(INSTALL_RDMA_CORE + "; then check that the HCA driver (mlx5_core/mlx5_ib) is loaded")
            if not_installed else
            "load the HCA driver (modprobe mlx5_ib) and check the NIC with `lspci | grep -i mellanox`; "
            "`ibv_devinfo` must list the devices",
        )]
    out = []
    for dev in exp.devices:
        if dev in found:
            out.append(Finding.ok("fabric.devices", node, dev, f"{dev} present"))
        else:
            out.append(Finding.fail(
                "fabric.devices", node, dev, f"{dev} not found (present: {', '.join(found)})",
                details={"present": found},
                remedy="fix nodes[].rdma.devices to match `ibv_devinfo -l`, or check the HCA and its driver"))
    return out


def judge_port(node: str, v: PortView, policy: FabricPolicy) -> list[Finding]:
    out = []
    state = f"{v.state or '?'} / {v.phys_state or '?'}"
    if v.active:
        out.append(Finding.ok("fabric.port_state", node, v.subject, f"port {state}"))
    else:
        if v.state == "INIT":
            hint = "the subnet manager has not configured the port (start opensm / check the SM)"
        elif v.roce and v.netdevs:
            hint = (f"`ip link set {v.netdevs[0]} up` on {node}; if it stays down, check the cable, the transceiver "
                    "and the switch port")
        else:
            hint = "check the cable, the transceiver and the switch port (and that the netdev is up for RoCE)"
        behind = f" (netdev {', '.join(v.netdevs)})" if v.roce and v.netdevs else ""
        out.append(Finding.fail("fabric.port_state", node, v.subject, f"port is {state}{behind}, expected ACTIVE / LinkUp",
                                details={"state": v.state, "phys_state": v.phys_state, "netdevs": v.netdevs}, remedy=hint))
    if v.link_layer and v.link_layer != policy.link_layer:
        out.append(Finding.fail("fabric.link_layer", node, v.subject,
                                f"link layer {v.link_layer}, profile expects {policy.link_layer}",
                                remedy="set the port type with mlxconfig LINK_TYPE_P1, or fix fabric.link_layer"))
    if v.rate_gbps is None:
        out.append(Finding.unknown("fabric.rate", node, v.subject, "link rate unknown",
                                   remedy="read /sys/class/infiniband/<dev>/ports/<n>/rate by hand"))
    elif policy.rate_gbps and v.rate_gbps < policy.rate_gbps:
        out.append(Finding.fail("fabric.rate", node, v.subject,
                                f"link runs at {v.rate_gbps:g} Gb/s, expected {policy.rate_gbps:g}",
                                details={"rate_gbps": v.rate_gbps, "rate": v.rate_text},
                                remedy="a degraded link: reseat or replace the cable/transceiver, check the switch port speed"))
    else:
        out.append(Finding.ok("fabric.rate", node, v.subject, f"{v.rate_gbps:g} Gb/s",
                              details={"rate_gbps": v.rate_gbps}))
    if v.active_mtu is None:
        out.append(Finding.unknown("fabric.mtu", node, v.subject, "active MTU unknown (ibv_devinfo gave no port data)",
                                   remedy=INSTALL_RDMA_CORE))
    elif v.active_mtu < policy.mtu:
        out.append(Finding.fail("fabric.mtu", node, v.subject, f"active MTU {v.active_mtu}, expected {policy.mtu}",
                                details={"active_mtu": v.active_mtu},
                                remedy=f"raise the netdev MTU to at least {policy.mtu + ROCE_HEADER_BYTES} (9000 is usual) "
                                       "on the node and the switch ports; RoCE's active MTU follows it"))
    else:
        out.append(Finding.ok("fabric.mtu", node, v.subject, f"active MTU {v.active_mtu}",
                              details={"active_mtu": v.active_mtu}))
    return out


def gid_choice(v: PortView, gid_index: int | None, prefer: Family = "ipv4") -> GidChoice | None:
    if gid_index is None:
        return choose_gid(v.gids, prefer)
    entry = next((g for g in v.gids if g.index == gid_index), None)
    return describe(entry, prefer) if entry else None


def judge_gid(node: str, v: PortView, gid_index: int | None, prefer: Family = "ipv4") -> Finding:
    best = choose_gid(v.gids, prefer)
    details: dict[str, object] = {"gids": len(v.gids), "perftest_choice": best.index if best else None, "prefer": prefer}
    if gid_index is not None:
        pinned = gid_choice(v, gid_index, prefer)
        if pinned is None:
            return Finding.fail("fabric.gid", node, v.subject, f"configured GID index {gid_index} is empty",
                                details=details,
                                remedy="remove nodes[].rdma.gid_index to let inferctl choose, or pick one from `show_gids`")
        if pinned.roce_version != 2:
            return Finding.fail("fabric.gid", node, v.subject, f"configured GID index {gid_index} is RoCE v1",
                                details=details, remedy="use a RoCE v2 index (routable, what Mooncake/NCCL expect)")
        return Finding.ok("fabric.gid", node, v.subject, f"GID index {gid_index} ({pinned.gid}, RoCE v2, {pinned.family})",
                          details={**details, "index": gid_index, "gid": pinned.gid, "family": pinned.family})
    if best is None:
        return Finding.fail("fabric.gid", node, v.subject, "GID table is empty",
                            remedy=f"assign an IP address to {_netdev_words(v)}; RoCE GIDs follow its addresses")
    details.update(index=best.index, gid=best.gid, family=best.family)
    if best.roce_version != 2:
        return Finding.fail("fabric.gid", node, v.subject, "no RoCE v2 GID (only v1)", details=details,
                            remedy="enable RoCE v2 (cma_roce_mode / mlxconfig) and assign an IP address to the netdev")
    if best.link_local:
        return Finding.warn("fabric.gid", node, v.subject,
                            f"only a link-local RoCE v2 GID (index {best.index}): not routable beyond one L2 segment",
                            details=details, remedy=f"assign an IPv4 (or global IPv6) address to {_netdev_words(v)}")
    return Finding.ok("fabric.gid", node, v.subject, f"GID index {best.index} ({best.gid}, RoCE v2, {best.family})",
                      details=details)


def judge_netdev(node: str, nd: NetdevFacts, policy: FabricPolicy, active_mtu: int | None) -> list[Finding]:
    out: list[Finding] = []
    name, prio = nd.name, policy.pfc_priority
    mtu = nd.sysfs.mtu if nd.sysfs else None
    need = policy.mtu + ROCE_HEADER_BYTES
    if mtu is None:
        out.append(Finding.unknown("fabric.netdev_mtu", node, name, "netdev MTU unknown (no /sys/class/net entry)",
                                   remedy="check nodes[].rdma.netdev names an existing interface"))
    elif policy.netdev_mtu is not None and mtu != policy.netdev_mtu:
        out.append(Finding.fail("fabric.netdev_mtu", node, name, f"MTU {mtu}, expected {policy.netdev_mtu}",
                                details={"mtu": mtu}, remedy=f"ip link set {name} mtu {policy.netdev_mtu} (persist it in netplan/NM)"))
    elif policy.netdev_mtu is None and mtu < need:
        out.append(Finding.fail("fabric.netdev_mtu", node, name, f"MTU {mtu} cannot carry RoCE MTU {policy.mtu} (needs >= {need})",
                                details={"mtu": mtu}, remedy=f"ip link set {name} mtu 9000 (and the switch ports)"))
    else:
        out.append(Finding.ok("fabric.netdev_mtu", node, name, f"MTU {mtu}", details={"mtu": mtu, "active_mtu": active_mtu}))
    out.append(_judge_pfc(node, nd, prio))
    out.append(_judge_trust(node, nd, policy.trust))
    out.append(_judge_ecn(node, nd, policy))
    out.append(_judge_pause(node, nd))
    if nd.pause_deltas is not None or nd.pause_counters_error:
        out.append(judge_pfc_pauses(node, nd, prio))
    return out


def _qos_unknown_remedy(nd: NetdevFacts) -> str:
    if nd.qos_error and "installed" in nd.qos_error:
        return INSTALL_QOS_TOOL
    return (f"run `mlnx_qos -i {nd.name}` or `dcb pfc show dev {nd.name}` on the node to see why it fails "
            "(root may be needed; the netdev's driver must support DCB)")


def _judge_pfc(node: str, nd: NetdevFacts, prio: int) -> Finding:
    if nd.qos is None or nd.qos.pfc is None:
        return Finding.unknown("fabric.pfc", node, nd.name, f"PFC state unknown: {nd.qos_error or 'no PFC table'}",
                               remedy=_qos_unknown_remedy(nd))
    on = nd.qos.pfc_priorities
    fix = f"mlnx_qos -i {nd.name} --pfc {','.join('1' if i == prio else '0' for i in range(8))} (or: dcb pfc set dev {nd.name} prio-pfc {' '.join(f'{i}:' + ('on' if i == prio else 'off') for i in range(8))})"
    details = {"enabled": on, "expected": prio, "source": nd.qos.source}
    if prio not in on:
        return Finding.fail("fabric.pfc", node, nd.name,
                            f"PFC is off on priority {prio} (on: {', '.join(map(str, on)) or 'none'})",
                            details=details, remedy=fix)
    if on != [prio]:
        return Finding.warn("fabric.pfc", node, nd.name, f"PFC is on for priorities {', '.join(map(str, on))}, expected only {prio}",
                            details=details, remedy=fix)
    return Finding.ok("fabric.pfc", node, nd.name, f"PFC on priority {prio} only", details=details)


def _judge_trust(node: str, nd: NetdevFacts, expected: str) -> Finding:
    trust = nd.trust
    if trust is None:
        return Finding.unknown("fabric.trust", node, nd.name, f"trust mode unknown: {nd.qos_error or 'not shown'}",
                               remedy=_qos_unknown_remedy(nd) if nd.qos_error else
                               f"check `cat /sys/class/net/{nd.name}/qos/trust` or `dcb apptrust show dev {nd.name}`")
    if trust != expected:
        return Finding.fail("fabric.trust", node, nd.name, f"trust mode {trust}, expected {expected}",
                            details={"trust": trust},
                            remedy=f"mlnx_qos -i {nd.name} --trust {expected} (or: dcb apptrust set dev {nd.name} order {expected})")
    return Finding.ok("fabric.trust", node, nd.name, f"trust {trust}", details={"trust": trust})


def _judge_ecn(node: str, nd: NetdevFacts, policy: FabricPolicy) -> Finding:
    prio = policy.pfc_priority
    if not policy.ecn:
        return Finding.skip("fabric.ecn", node, nd.name, "ECN not required by the profile")
    s = nd.sysfs
    if s is None or (not s.ecn_np and not s.ecn_rp):
        return Finding.skip("fabric.ecn", node, nd.name,
                            f"ECN state not exposed (no /sys/class/net/{nd.name}/ecn: upstream driver)",
                            remedy="verify ECN/DCQCN with `mlxconfig -d <dev> q | grep -i ROCE_CC` or the mlx5 debugfs cc_params")
    np_on, rp_on = s.ecn_np.get(prio, False), s.ecn_rp.get(prio, False)
    details = {"np": np_on, "rp": rp_on, "cnp_dscp": s.cnp_dscp, "cnp_802p_prio": s.cnp_802p_prio}
    if np_on and rp_on:
        return Finding.ok("fabric.ecn", node, nd.name,
                          f"ECN on for priority {prio} (CNP dscp {s.cnp_dscp}, prio {s.cnp_802p_prio})", details=details)
    off = [n for n, on in (("roce_np", np_on), ("roce_rp", rp_on)) if not on]
    return Finding.fail("fabric.ecn", node, nd.name, f"ECN off on priority {prio} ({', '.join(off)})", details=details,
                        remedy="; ".join(f"echo 1 > /sys/class/net/{nd.name}/ecn/{n}/enable/{prio}" for n in off))


def _judge_pause(node: str, nd: NetdevFacts) -> Finding:
    if nd.pause is None:
        installed = not (nd.pause_error and "not installed" in nd.pause_error)
        return Finding.unknown("fabric.pause", node, nd.name, f"global pause unknown: {nd.pause_error or 'not read'}",
                               remedy=f"run `ethtool -a {nd.name}` on the node to see why it fails" if installed
                               else "install ethtool (apt-get install ethtool)")
    if nd.pause.rx or nd.pause.tx:
        return Finding.fail("fabric.pause", node, nd.name,
                            f"global pause is on (rx {'on' if nd.pause.rx else 'off'}, tx {'on' if nd.pause.tx else 'off'})",
                            details={"rx": nd.pause.rx, "tx": nd.pause.tx},
                            remedy=f"ethtool -A {nd.name} rx off tx off; link-level pause stalls all traffic and excludes PFC")
    return Finding.ok("fabric.pause", node, nd.name, "global pause off")


def judge_pfc_pauses(node: str, nd: NetdevFacts, prio: int) -> Finding:
    """Per-priority PFC pause frames (`ethtool -S` rx/tx_prio<N>_pause) between the two samples. Pauses on
    the RoCE priority are congestion that ECN did not absorb (a warning); pauses on any other priority mean
    the host and the switch disagree about which priority is lossless (a misconfiguration)."""
    if nd.pause_deltas is None:
        return Finding.skip("fabric.pfc_pauses", node, nd.name, f"per-priority pause counters not read: {nd.pause_counters_error}",
                            remedy=f"`ethtool -S {nd.name} | grep prio` shows them on mlx5 NICs")
    interval = nd.pause_interval_s
    grown = {k: v for k, v in nd.pause_deltas.items() if v > 0}
    other = {k: v for k, v in grown.items() if pause_priority(k) != prio}
    on_prio = {k: v for k, v in grown.items() if pause_priority(k) == prio}
    details = {"interval_s": interval, "grown": grown, "pfc_priority": prio}
    listing = ", ".join(f"{k} +{v}" for k, v in sorted({**other, **on_prio}.items()))
    if other:
        prios = sorted({p for k in other if (p := pause_priority(k)) is not None})
        return Finding.fail("fabric.pfc_pauses", node, nd.name,
                            f"PFC pause frames on priority {', '.join(map(str, prios))} in {interval:g}s, but the RoCE "
                            f"priority is {prio}: {listing}", details=details,
                            remedy=f"make the switch port and {node} agree on the lossless priority: PFC only on {prio} "
                                   f"on both (mlnx_qos -i {nd.name} --pfc, the switch's PFC/DSCP map), and the RoCE "
                                   f"traffic class mapped to priority {prio}")
    if on_prio:
        return Finding.warn("fabric.pfc_pauses", node, nd.name,
                            f"PFC pause frames on priority {prio} grew in {interval:g}s: {listing}", details=details,
                            remedy="the lossless queue is congested: check ECN/DCQCN is on along the path (CNPs sent "
                                   "and handled), look for incast or a slow receiver; a steady climb stalls KV transfers")
    return Finding.ok("fabric.pfc_pauses", node, nd.name, f"no PFC pause frames in {interval:g}s", details=details)


def judge_counters(node: str, port: str, grown: Mapping[str, int], interval_s: float) -> Finding:
    errors = {k: v for k, v in grown.items() if k in ERROR_COUNTERS}
    congestion = {k: v for k, v in grown.items() if k in CONGESTION_COUNTERS}
    details = {"interval_s": interval_s, "errors": errors, "congestion": congestion}
    if "link_downed" in errors:
        return Finding.fail("fabric.counters", node, port, f"link went down {errors['link_downed']}x in {interval_s:g}s",
                            details=details, remedy="a flapping link: check cable/transceiver and the switch port log")
    if errors:
        listing = ", ".join(f"{k} +{v}" for k, v in sorted(errors.items()))
        return Finding.warn("fabric.counters", node, port, f"error counters grew in {interval_s:g}s: {listing}",
                            details=details,
                            remedy="symbol/rcv errors point at the cable; out_of_sequence/packet_seq_err/ack timeouts "
                                   "at drops, i.e. PFC not protecting the RoCE priority end to end")
    return Finding.ok("fabric.counters", node, port, f"no error counter grew in {interval_s:g}s", details=details)


def judge_nic_pcie(node: str, device: str, pcie: NicPcie, policy: FabricPolicy) -> Finding | None:
    """fabric.nic_pcie: the NIC's own PCIe link against its maximum (or the profile's platform values).
    Fewer lanes is a FAIL (a badly seated card or riser: GCM fails on sysfs width below the manifest);
    a lower speed is a WARN (often a slot a generation older than the NIC: set fabric.nic_pcie_speed_gts)."""
    want_width = policy.nic_pcie_width or pcie.max_width
    want_speed = policy.nic_pcie_speed_gts or pcie.max_speed_gts
    if pcie.width is None and pcie.speed_gts is None:
        return None
    details = {"width": pcie.width, "max_width": pcie.max_width, "speed_gts": pcie.speed_gts,
               "max_speed_gts": pcie.max_speed_gts, "expected_width": policy.nic_pcie_width,
               "expected_speed_gts": policy.nic_pcie_speed_gts}
    shown = f"PCIe x{pcie.width} at {pcie.speed_gts:g} GT/s" if pcie.speed_gts else f"PCIe x{pcie.width}"
    if pcie.width is not None and want_width and pcie.width < want_width:
        return Finding.fail("fabric.nic_pcie", node, device, f"NIC trained at x{pcie.width} of x{want_width}: "
                            f"its PCIe link is a fraction of what the port needs", details=details,
                            remedy=f"reseat the NIC ({device}) and its riser, check the slot (`lspci -vv` LnkSta "
                                   "vs LnkCap); if the platform wires it narrower, set fabric.nic_pcie_width")
    if pcie.speed_gts is not None and want_speed and pcie.speed_gts < want_speed:
        return Finding.warn("fabric.nic_pcie", node, device, f"NIC link at {pcie.speed_gts:g} GT/s, it supports "
                            f"{want_speed:g} GT/s", details=details,
                            remedy="check the slot generation and BIOS PCIe settings (a Gen5 NIC in a Gen4 slot "
                                   "runs at 16 GT/s); if that is the platform, set fabric.nic_pcie_speed_gts")
    return Finding.ok("fabric.nic_pcie", node, device, shown, details=details)


def judge_sglang_devices(node: str, facts: NodeFabricFacts, names: Sequence[str]) -> list[Finding]:
    found = facts.device_names()
    out = []
    for name in names:
        if name in found:
            out.append(Finding.ok("fabric.sglang_ib_device", node, name, f"--disaggregation-ib-device {name} exists"))
        else:
            out.append(Finding.fail("fabric.sglang_ib_device", node, name,
                                    f"SGLang is given --disaggregation-ib-device {name}, which does not exist "
                                    f"(present: {', '.join(found) or 'none'})",
                                    remedy="fix nodes[].rdma.device_map or sglang.extra_args to name devices from `ibv_devinfo -l`"))
    return out


def judge_node(facts: NodeFabricFacts, exp: FabricExpectations) -> list[Finding]:
    """Every per-node rule, in report order."""
    out = judge_presence(facts, exp)
    if not facts.device_names():
        return out
    node, policy = facts.node, exp.policy
    present = set(facts.device_names())
    roce_mtus: dict[str, int | None] = {}
    seen_netdevs: list[str] = []
    for dev in checked_devices(facts, exp):
        if dev not in present:
            continue
        pcie = (facts.nic_pcie or {}).get(dev)
        if pcie is not None and (f := judge_nic_pcie(node, dev, pcie, policy)) is not None:
            out.append(f)
        for v in port_views(facts, dev):
            out += judge_port(node, v, policy)
            if v.roce:
                out.append(judge_gid(node, v, exp.gid_index, policy.gid_family))
                seen_netdevs += [n for n in v.netdevs if n not in seen_netdevs]
                for nd in v.netdevs or ([exp.netdev] if exp.netdev else []):
                    roce_mtus.setdefault(nd, v.active_mtu)
            if facts.counter_deltas is not None and v.subject in facts.counter_deltas:
                out.append(judge_counters(node, v.subject, facts.counter_deltas[v.subject], facts.counter_interval_s))
    if exp.netdev and seen_netdevs and exp.netdev not in seen_netdevs:
        out.append(judge_profile_netdev(facts, exp.netdev, seen_netdevs))
    for name, active_mtu in roce_mtus.items():
        netdev = facts.netdevs.get(name)
        if netdev is None:
            out.append(Finding.fail("fabric.netdev", node, name, f"netdev {name} not found on {node}",
                                    details={"missing": name},
                                    remedy="fix nodes[].rdma.netdev to the interface behind the HCA (`ip -br link`, "
                                           "`rdma link show`), or check that the NIC driver created it"))
            continue
        out += judge_netdev(node, netdev, policy, active_mtu)
    out += judge_sglang_devices(node, facts, [d for d in exp.sglang_ib_devices if d not in exp.devices])
    return out


def judge_profile_netdev(facts: NodeFabricFacts, configured: str, actual: Sequence[str]) -> Finding:
    """nodes[].rdma.netdev names an interface that is not behind any checked HCA (a typo, or a renamed NIC):
    whatever reads that setting (provisioning, SGLang's NCCL/Gloo interface) would use the wrong port."""
    missing = facts.sysfs is not None and configured in facts.sysfs.missing_netdevs
    where = "does not exist" if missing else "is not behind any checked RDMA device"
    return Finding.fail("fabric.netdev", facts.node, configured,
                        f"nodes[].rdma.netdev {configured} {where} (the HCAs' netdevs: {', '.join(actual)})",
                        details={"configured": configured, "actual": list(actual)},
                        remedy=f"set nodes[].rdma.netdev to {actual[0]} for {facts.node}" if len(actual) == 1 else
                        f"set nodes[].rdma.netdev to one of {', '.join(actual)} for {facts.node}")


# ---- across nodes --------------------------------------------------------------------------------
def gid_families(facts: NodeFabricFacts, exp: FabricExpectations) -> set[Family]:
    """The families of the RoCE v2 GIDs a node's checked, active ports would use (for judge_gid_families)."""
    fams: set[Family] = set()
    present = set(facts.device_names())
    for dev in checked_devices(facts, exp):
        if dev not in present:
            continue
        for v in port_views(facts, dev):
            choice = gid_choice(v, exp.gid_index, exp.policy.gid_family) if v.roce and v.active else None
            if choice is not None and choice.roce_version == 2:
                fams.add(choice.family)
    return fams


def judge_gid_families(families: Mapping[str, set[str]], prefer: str = "ipv4") -> list[Finding]:
    """RoCE cannot build an address handle between an IPv4-mapped and an IPv6 GID (rpingmesh#41), so
    every node's chosen GIDs must share one family. The fleet's family is the majority's; an even split
    goes to the profile's `fabric.gid_family`, so the odd node out is named rather than a coin toss.
    Nodes with several families are judged alone."""
    counts = Counter(f for fams in families.values() for f in fams)
    if not counts:
        return []
    top = max(counts.values())
    tied = sorted(f for f, n in counts.items() if n == top)
    majority = prefer if prefer in tied else tied[0]
    out = []
    for node, fams in families.items():
        if len(fams) > 1:
            out.append(Finding.fail("fabric.gid_family", node, "gid", f"devices mix GID families {sorted(fams)}",
                                    remedy="give every RoCE netdev an address of the same family (IPv4 usually)"))
        elif fams and next(iter(fams)) != majority:
            fam = next(iter(fams))
            out.append(Finding.fail("fabric.gid_family", node, "gid",
                                    f"chosen GID family {fam} differs from the fleet's {majority}; peers cannot connect",
                                    details={"family": fam, "fleet": majority},
                                    remedy=f"assign an {majority} address to the RoCE netdev (or pin nodes[].rdma.gid_index)"))
        elif fams:
            out.append(Finding.ok("fabric.gid_family", node, "gid", f"GID family {majority}, same as all peers"))
    return out
