"""Fabric checks: gather RDMA facts on every node over its connector (commands and parsers of
infer_ctl.facts), judge them with core.fabric.rules, and (with `pingpong`) run the pair tests of
checks.pingpong.

Per node the gatherer costs a few round trips: the sysfs script (devices, GIDs, netdevs, counters,
tool presence), the NICs' PCIe links (facts/nic_pcie.py), `ibv_devinfo -v`, one QoS tool and
`ethtool -a` per RoCE netdev, and the second
counter sample `counter_interval_s` after the first.

Test seam: `INFERCTL_SYSFS_ROOT` in inferctl's own environment is forwarded to the nodes' gatherer
as the sysfs root, with `{node}` replaced by the node name (tests point each node at its own tree).
A node may also set INFERCTL_SYSFS_ROOT in its own environment. Unset means /sys.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infer_ctl.checks.link_flaps import check_link_flaps
from infer_ctl.checks.registry import AuditContext, CheckFamily
from infer_ctl.core.fabric.expectations import FabricExpectations, expectations
from infer_ctl.core.fabric.facts import NetdevFacts, NodeFabricFacts, QosFacts
from infer_ctl.core.fabric.rules import gid_families, judge_gid_families, judge_node
from infer_ctl.core.findings import Finding
from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.facts.ibv_devinfo import IBV_DEVINFO_V, devinfo_error, parse_ibv_devinfo
from infer_ctl.facts.nic_pcie import nic_pcie_command, parse_nic_pcie
from infer_ctl.facts.qos import (
    QosParseError,
    dcb_app_command,
    dcb_apptrust_command,
    dcb_pfc_command,
    ethtool_pause_command,
    ethtool_pause_text_command,
    ethtool_stats_command,
    mlnx_qos_command,
    parse_dcb_app_dscp,
    parse_dcb_apptrust,
    parse_dcb_pfc,
    parse_ethtool_pause,
    parse_ethtool_stats,
    parse_mlnx_qos,
    prio_pause_counters,
)
from infer_ctl.facts.rdma_link import RDMA_LINK_JSON, parse_rdma_link
from infer_ctl.facts.rdma_sysfs import (
    counter_deltas,
    counters_command,
    parse_counters_dump,
    parse_sysfs_dump,
    sysfs_command,
    sysfs_root_for,
)
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Connector

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

TOOL_TIMEOUT_S = 30.0
PAIR_MODES = ("prefill-decode", "mesh", "explicit")


@dataclass
class FabricRun:
    """Everything `inferctl check fabric` reports: findings plus the per-node facts the pair tests use."""

    findings: list[Finding] = field(default_factory=list)
    facts: dict[str, NodeFabricFacts] = field(default_factory=dict)
    #: pair-test summary for the matrix (filled by checks.pingpong)
    pairs: dict[str, Any] = field(default_factory=dict)


def gather_node(conn: Connector, node: Node, exp: FabricExpectations, *, interval_s: float | None = None) -> NodeFabricFacts:
    facts = NodeFabricFacts(node.name)
    root = sysfs_root_for(node.name)
    first = time.monotonic()
    res = conn.run(sysfs_command([exp.netdev] if exp.netdev else [], root=root), timeout=TOOL_TIMEOUT_S)
    if res.ok:
        facts.sysfs = parse_sysfs_dump(res.out)
    else:
        facts.sysfs_error = f"sysfs gatherer failed (exit {res.exit_code}): {(res.err or res.out).strip()[:200]}"
    res = conn.run(IBV_DEVINFO_V, timeout=TOOL_TIMEOUT_S)
    facts.devinfo_error = devinfo_error(None if res.timed_out else res.exit_code, res.out, res.err)
    facts.devinfo = parse_ibv_devinfo(res.out) if facts.devinfo_error is None else []
    if not facts.device_names():
        return facts
    if facts.sysfs is not None and facts.sysfs.devices:
        res = conn.run(nic_pcie_command(root), timeout=TOOL_TIMEOUT_S)
        facts.nic_pcie = parse_nic_pcie(res.out) if res.ok else None
    tools = facts.sysfs.tools if facts.sysfs else {}
    if facts.sysfs is not None and not facts.sysfs.devices and "rdma" in tools:
        _links_fallback(conn, facts, exp, root)
    for name in facts.sysfs.netdevs if facts.sysfs else []:
        facts.netdevs[name] = _gather_netdev(conn, name, tools, facts)
    interval = exp.policy.counter_interval_s if interval_s is None else interval_s
    if facts.sysfs and facts.sysfs.devices and interval > 0:
        before = {p.key: dict(p.counters) for d in facts.sysfs.devices.values() for p in d.ports.values()}
        pauses_before = {n: _prio_pauses(conn, nd, tools) for n, nd in facts.netdevs.items()}
        pauses_start = time.monotonic()
        time.sleep(max(0.0, interval - (time.monotonic() - first)))
        res = conn.run(counters_command(root), timeout=TOOL_TIMEOUT_S)
        if res.ok:
            facts.counter_deltas = counter_deltas(before, parse_counters_dump(res.out))
            facts.counter_interval_s = round(time.monotonic() - first, 2)
        for name, nd in facts.netdevs.items():
            if pauses_before.get(name) is not None:
                after = _prio_pauses(conn, nd, tools)
                if after is not None:
                    nd.pause_deltas = counter_deltas({"": pauses_before[name] or {}}, {"": after})[""]
                    nd.pause_interval_s = round(time.monotonic() - pauses_start, 2)
    return facts


def _prio_pauses(conn: Connector, nd: NetdevFacts, tools: dict[str, str]) -> dict[str, int] | None:
    """`ethtool -S` rx/tx_prio<N>_pause of one netdev; None (and the reason on `nd`) when unavailable."""
    if tools and "ethtool" not in tools:
        nd.pause_counters_error = "ethtool is not installed"
        return None
    res = conn.run(ethtool_stats_command(nd.name), timeout=TOOL_TIMEOUT_S)
    if not res.ok:
        nd.pause_counters_error = f"ethtool -S {nd.name} failed: {(res.err or res.out).strip()[:200]}"
        return None
    counters = prio_pause_counters(parse_ethtool_stats(res.out))
    if not counters:
        nd.pause_counters_error = f"ethtool -S {nd.name} shows no rx/tx_prio<N>_pause counters (not an mlx5 NIC?)"
        return None
    nd.pause_counters_error = None
    return counters


def _links_fallback(conn: Connector, facts: NodeFabricFacts, exp: FabricExpectations, root: str | None) -> None:
    """No /sys/class/infiniband (a container, a restricted mount) but ibv_devinfo sees devices: take port
    state and the netdev of each port from `rdma link`, then read those netdevs' sysfs files."""
    res = conn.run(RDMA_LINK_JSON, timeout=TOOL_TIMEOUT_S)
    if not res.ok:
        return
    try:
        facts.links = parse_rdma_link(res.out)
    except ValueError:
        return
    names = sorted({lk.netdev for lk in facts.links if lk.netdev} | ({exp.netdev} if exp.netdev else set()))
    if not names or facts.sysfs is None:
        return
    res = conn.run(sysfs_command(names, root=root), timeout=TOOL_TIMEOUT_S)
    if res.ok:
        facts.sysfs.netdevs.update(parse_sysfs_dump(res.out).netdevs)


def _gather_netdev(conn: Connector, name: str, tools: dict[str, str], facts: NodeFabricFacts) -> NetdevFacts:
    nd = NetdevFacts(name, sysfs=facts.sysfs.netdevs.get(name) if facts.sysfs else None)
    has = (lambda t: t in tools) if tools else (lambda t: True)
    if has("mlnx_qos"):
        res = conn.run(mlnx_qos_command(name), timeout=TOOL_TIMEOUT_S)
        if res.ok:
            try:
                nd.qos = parse_mlnx_qos(res.out)
            except QosParseError as exc:
                nd.qos_error = str(exc)
        else:
            nd.qos_error = f"mlnx_qos -i {name} failed: {(res.err or res.out).strip()[:200]}"
    if nd.qos is None and has("dcb"):
        nd.qos, nd.dcb_trust, err = _dcb(conn, name)
        nd.qos_error = err or nd.qos_error
    if nd.qos is None and nd.qos_error is None:
        nd.qos_error = "neither mlnx_qos nor dcb is installed"
    if has("ethtool"):
        res = conn.run(ethtool_pause_command(name), timeout=TOOL_TIMEOUT_S)
        if not res.ok:  # ethtool older than 5.10 has no --json
            res = conn.run(ethtool_pause_text_command(name), timeout=TOOL_TIMEOUT_S)
        try:
            nd.pause = parse_ethtool_pause(res.out) if res.ok else None
            nd.pause_error = None if res.ok else f"ethtool -a {name} failed: {(res.err or res.out).strip()[:200]}"
        except QosParseError as exc:
            nd.pause_error = str(exc)
    else:
        nd.pause_error = "ethtool is not installed"
    return nd


def _dcb(conn: Connector, name: str) -> tuple[QosFacts | None, str | None, str | None]:
    res = conn.run(dcb_pfc_command(name), timeout=TOOL_TIMEOUT_S)
    if not res.ok:
        return None, None, f"dcb pfc show dev {name} failed: {(res.err or res.out).strip()[:200]}"
    try:
        qos = QosFacts("dcb", pfc=parse_dcb_pfc(res.out))
    except QosParseError as exc:
        return None, None, str(exc)
    trust = None
    res = conn.run(dcb_apptrust_command(name), timeout=TOOL_TIMEOUT_S)
    if res.ok:
        trust = parse_dcb_apptrust(res.out)
    if trust is None:  # iproute2 before apptrust: any DSCP APP entry means the port trusts DSCP
        res = conn.run(dcb_app_command(name), timeout=TOOL_TIMEOUT_S)
        if res.ok:
            qos.dscp2prio = parse_dcb_app_dscp(res.out)
            trust = "dscp" if qos.dscp2prio else "pcp"
    return qos, trust, None


def unreachable(node: str, error: InferctlError) -> Finding:
    return Finding.unknown("fabric.node", node, "ssh", f"fabric facts not gathered: {error.message}",
                           details={"not_gathered": ["fabric.*"]},
                           remedy=error.remedy or "check the node is reachable with `inferctl nodes`")


def check_fabric(profile: Profile, fleet: Fleet, nodes: list[Node], *, pingpong: bool = False,
                 pair_mode: str | None = None, memory: dict[str, Any] | None = None) -> FabricRun:
    if pair_mode is not None and pair_mode not in PAIR_MODES:
        raise UsageError(f"--pairs {pair_mode!r} is not a pair mode", remedy=f"use one of: {', '.join(PAIR_MODES)}")
    run = FabricRun()
    exps = {n.name: expectations(profile, n) for n in nodes}
    outcomes = fleet.map(nodes, lambda conn, node: gather_node(conn, node, exps[node.name]))
    families: dict[str, set[str]] = {}
    for o in outcomes:
        if o.error is not None:
            run.findings.append(unreachable(o.node.name, o.error))
            continue
        facts = o.value
        assert facts is not None  # gather_node returns facts whenever it does not raise
        run.facts[o.node.name] = facts
        run.findings += judge_node(facts, exps[o.node.name])
        fams = gid_families(facts, exps[o.node.name])
        if fams:
            families[o.node.name] = set(fams)
    if len(families) > 1:
        run.findings += judge_gid_families(families, profile.fabric.gid_family)
    # links that went down, judged with what earlier audits saw (memory)
    run.findings += check_link_flaps(profile, fleet, [n for n in nodes if n.name in run.facts], memory)
    if pingpong:
        from infer_ctl.checks.pingpong import run_pair_tests

        found, run.pairs = run_pair_tests(profile, fleet, nodes, run.facts, exps, pair_mode=pair_mode)
        run.findings += found
    return run


def _family_run(ctx: AuditContext) -> list[Finding]:
    return check_fabric(ctx.profile, ctx.fleet, ctx.nodes, pingpong=bool(ctx.options.get("pingpong")),
                        memory=ctx.options.get("memory")).findings


FAMILY = CheckFamily(
    name="fabric",
    description="RDMA/RoCE fabric: devices, link state, NIC PCIe link, GIDs, PFC/trust/ECN, MTU, pause, counters (+ pair tests)",
    run=_family_run,
)

__all__ = ["FAMILY", "FabricRun", "check_fabric", "gather_node"]
