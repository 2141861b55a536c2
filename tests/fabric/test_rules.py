"""Fabric rules, table-driven: one misconfiguration per row, the finding it must produce."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.core.fabric.expectations import FabricExpectations
from infer_ctl.core.fabric.facts import DevinfoError, NodeFabricFacts
from infer_ctl.core.fabric.rules import judge_gid_families, judge_node
from infer_ctl.core.findings import Finding, Status
from infer_ctl.profile.fabric import FabricPolicy
from tests.fabric.factories import FIX, node_facts
from tests.fabric.sysfs_tree import Hca, Netdev, mlx5_gids

POLICY = FabricPolicy(rate_gbps=400, netdev_mtu=9000)
EXP = FabricExpectations(POLICY, devices=("mlx5_0",))
PCP_NO_PFC = (FIX / "mlnx_qos" / "magnate3-cx-ens6-trust-pcp-default.txt").read_text()
PAUSE_ON = (FIX / "ethtool-a" / "ethtool-commit-7e5c1d-a-text-negotiated.txt").read_text()


def _find(findings: list[Finding], check: str, subject: str | None = None) -> Finding:
    hits = [f for f in findings if f.check == check and (subject is None or f.subject == subject)]
    assert hits, f"no {check} finding in {[(f.check, f.subject) for f in findings]}"
    return hits[0]


def test_healthy_node_is_all_ok(tmp_path: Path) -> None:
    findings = judge_node(node_facts(tmp_path), EXP)
    bad = [(f.check, f.subject, f.status, f.message) for f in findings if f.status not in (Status.OK, Status.SKIP)]
    assert bad == []
    checks = {f.check for f in findings}
    assert checks >= {"fabric.devices", "fabric.port_state", "fabric.rate", "fabric.mtu", "fabric.gid", "fabric.netdev_mtu",
                      "fabric.pfc", "fabric.trust", "fabric.ecn", "fabric.pause", "fabric.counters"}
    gid = _find(findings, "fabric.gid")
    assert (gid.details["index"], gid.details["family"]) == (3, "ipv4")


CASES: list[tuple[str, dict[str, Any], FabricExpectations, str, str, Status, str]] = [
    ("link down", {"hcas": [Hca(state="1: DOWN", phys_state="3: Disabled")]}, EXP,
     "fabric.port_state", "mlx5_0/1", Status.FAIL, "DOWN / Disabled"),
    ("ib port waiting for SM", {"hcas": [Hca(state="2: INIT", link_layer="InfiniBand")]}, EXP,
     "fabric.port_state", "mlx5_0/1", Status.FAIL, "INIT"),
    ("degraded rate", {"hcas": [Hca(rate="200 Gb/sec (2X NDR)")]}, EXP, "fabric.rate", "mlx5_0/1", Status.FAIL, "200"),
    ("wrong link layer", {"hcas": [Hca(link_layer="InfiniBand")]}, EXP, "fabric.link_layer", "mlx5_0/1", Status.FAIL, "InfiniBand"),
    ("small active mtu", {"active_mtu": 1024}, EXP, "fabric.mtu", "mlx5_0/1", Status.FAIL, "active MTU 1024"),
    ("netdev mtu", {"netdevs": [Netdev(mtu=1500)]}, EXP, "fabric.netdev_mtu", "ens1f0np0", Status.FAIL, "MTU 1500"),
    ("pfc off on prio 3, trust pcp", {"qos": PCP_NO_PFC}, EXP, "fabric.pfc", "ens1f0np0", Status.FAIL, "off on priority 3"),
    ("pfc on wrong priority", {"qos": PCP_NO_PFC}, FabricExpectations(FabricPolicy(pfc_priority=5, rate_gbps=400, netdev_mtu=9000)),
     "fabric.pfc", "ens1f0np0", Status.FAIL, "priority 5"),
    ("trust pcp", {"netdevs": [Netdev(trust=None)], "qos": PCP_NO_PFC}, EXP, "fabric.trust", "ens1f0np0", Status.FAIL, "trust mode pcp"),
    ("sysfs trust wins", {"netdevs": [Netdev(trust="pcp")]}, EXP, "fabric.trust", "ens1f0np0", Status.FAIL, "pcp"),
    ("ecn off", {"netdevs": [Netdev(ecn_np={3: 0}, ecn_rp={3: 1})]}, EXP, "fabric.ecn", "ens1f0np0", Status.FAIL, "roce_np"),
    ("ecn not exposed", {"netdevs": [Netdev(ecn_np=None, ecn_rp=None)]}, EXP, "fabric.ecn", "ens1f0np0", Status.SKIP, "not exposed"),
    ("global pause", {"pause": PAUSE_ON}, EXP, "fabric.pause", "ens1f0np0", Status.FAIL, "global pause is on"),
    ("no qos tool", {"qos": None}, EXP, "fabric.pfc", "ens1f0np0", Status.UNKNOWN, "neither mlnx_qos nor dcb"),
    ("no ethtool", {"pause": None}, EXP, "fabric.pause", "ens1f0np0", Status.UNKNOWN, "ethtool"),
    ("only v1 gids", {"hcas": [Hca(gids=[(0, "fe80::1", "IB/RoCE v1"), (1, "::ffff:10.0.0.1", "IB/RoCE v1")])]}, EXP,
     "fabric.gid", "mlx5_0/1", Status.FAIL, "no RoCE v2"),
    ("link-local only", {"hcas": [Hca(gids=mlx5_gids()[:2])]}, EXP, "fabric.gid", "mlx5_0/1", Status.WARN, "link-local"),
    ("pinned empty gid", {}, FabricExpectations(POLICY, devices=("mlx5_0",), gid_index=7),
     "fabric.gid", "mlx5_0/1", Status.FAIL, "index 7 is empty"),
    ("pinned v1 gid", {}, FabricExpectations(POLICY, devices=("mlx5_0",), gid_index=2),
     "fabric.gid", "mlx5_0/1", Status.FAIL, "RoCE v1"),
    ("missing device", {}, FabricExpectations(POLICY, devices=("mlx5_0", "mlx5_3")), "fabric.devices", "mlx5_3", Status.FAIL,
     "mlx5_3 not found"),
    ("sglang device missing", {}, FabricExpectations(POLICY, devices=("mlx5_0",), sglang_ib_devices=("mlx5_0", "mlx5_9")),
     "fabric.sglang_ib_device", "mlx5_9", Status.FAIL, "--disaggregation-ib-device mlx5_9"),
]


@pytest.mark.parametrize(("name", "kw", "exp", "check", "subject", "status", "text"), CASES, ids=[c[0] for c in CASES])
def test_misconfiguration_yields_precise_finding(
    tmp_path: Path, name: str, kw: dict[str, Any], exp: FabricExpectations, check: str, subject: str, status: Status, text: str
) -> None:
    f = _find(judge_node(node_facts(tmp_path, **kw), exp), check, subject)
    assert f.status is status, f.message
    assert text in f.message
    if status in (Status.FAIL, Status.WARN, Status.UNKNOWN):
        assert f.remedy, "every problem says what to do next"


COUNTER_CASES: list[tuple[dict[str, int], Status, str]] = [
    ({}, Status.OK, "no error counter grew"),
    ({"np_cnp_sent": 50}, Status.OK, "no error counter grew"),
    ({"symbol_error": 3, "out_of_sequence": 9}, Status.WARN, "out_of_sequence +9, symbol_error +3"),
    ({"link_downed": 1}, Status.FAIL, "link went down 1x"),
]


@pytest.mark.parametrize(("grown", "status", "text"), COUNTER_CASES)
def test_counter_growth(tmp_path: Path, grown: dict[str, int], status: Status, text: str) -> None:
    facts = node_facts(tmp_path)
    facts.counter_deltas = {"mlx5_0/1": grown}
    f = _find(judge_node(facts, EXP), "fabric.counters")
    assert f.status is status and text in f.message


MISSING: list[tuple[str, Callable[[], NodeFabricFacts], FabricExpectations, Status, str]] = [
    ("rdma-core missing",
     lambda: NodeFabricFacts("n", devinfo_error=DevinfoError("not-installed", "ibv_devinfo is not installed")),
     EXP, Status.FAIL, "apt-get install rdma-core"),
    ("no device (this machine)",
     lambda: NodeFabricFacts("n", devinfo_error=DevinfoError("no-devices", "ibv_devinfo: Failed to get IB devices list: Function not implemented")),
     EXP, Status.FAIL, "modprobe mlx5_ib"),
    ("no device, none needed",
     lambda: NodeFabricFacts("n", devinfo_error=DevinfoError("no-devices", "none")),
     FabricExpectations(POLICY, needs_rdma=False), Status.SKIP, ""),
]


@pytest.mark.parametrize(("name", "make", "exp", "status", "remedy"), MISSING, ids=[m[0] for m in MISSING])
def test_missing_hardware_or_tools(name: str, make: Callable[[], NodeFabricFacts], exp: FabricExpectations,
                                   status: Status, remedy: str) -> None:
    findings = judge_node(make(), exp)
    assert [f.check for f in findings] == ["fabric.devices"]
    assert findings[0].status is status
    assert remedy in (findings[0].remedy or "")


def test_gid_family_must_match_across_nodes() -> None:
    findings = judge_gid_families({"pf-01": {"ipv4"}, "dc-01": {"ipv4"}, "dc-02": {"ipv6"}, "dc-03": {"ipv4", "ipv6"}})
    status = {f.node: f.status for f in findings}
    assert status == {"pf-01": Status.OK, "dc-01": Status.OK, "dc-02": Status.FAIL, "dc-03": Status.FAIL}
    assert "differs from the fleet's ipv4" in next(f.message for f in findings if f.node == "dc-02")
    assert judge_gid_families({}) == []


# ---- the NIC's own PCIe link ------------------------------------------------------------------------
def test_nic_pcie_parser_reads_the_kernel_formats() -> None:
    from infer_ctl.facts.nic_pcie import parse_nic_pcie

    text = ("mlx5_0 current_link_width 8\nmlx5_0 max_link_width 16\nmlx5_0 current_link_speed 32.0 GT/s PCIe\n"
            "mlx5_0 max_link_speed 32.0 GT/s PCIe\nmlx5_1 current_link_speed 8 GT/s\nmlx5_1 max_link_speed Unknown\n")
    got = parse_nic_pcie(text)
    assert (got["mlx5_0"].width, got["mlx5_0"].max_width, got["mlx5_0"].speed_gts) == (8, 16, 32.0)
    assert (got["mlx5_1"].speed_gts, got["mlx5_1"].max_speed_gts, got["mlx5_1"].width) == (8.0, None, None)


@pytest.mark.parametrize(("pcie", "policy", "status", "text"), [
    (dict(width=16, max_width=16, speed_gts=32.0, max_speed_gts=32.0), {}, Status.OK, "PCIe x16 at 32 GT/s"),
    (dict(width=8, max_width=16, speed_gts=32.0, max_speed_gts=32.0), {}, Status.FAIL, "x8 of x16"),
    (dict(width=8, max_width=16, speed_gts=32.0, max_speed_gts=32.0), {"nic_pcie_width": 8}, Status.OK, "x8"),
    (dict(width=16, max_width=16, speed_gts=16.0, max_speed_gts=32.0), {}, Status.WARN, "16 GT/s, it supports 32"),
    (dict(width=16, max_width=16, speed_gts=16.0, max_speed_gts=32.0), {"nic_pcie_speed_gts": 16}, Status.OK, "16 GT/s"),
])
def test_nic_pcie_rule(pcie: dict, policy: dict, status: Status, text: str) -> None:  # type: ignore[type-arg]
    from infer_ctl.core.fabric.facts import NicPcie
    from infer_ctl.core.fabric.rules import judge_nic_pcie

    f = judge_nic_pcie("n1", "mlx5_0", NicPcie(**pcie), FabricPolicy(**policy))
    assert f is not None and f.status is status and text in f.message and f.check == "fabric.nic_pcie"
    assert (f.remedy is not None) == (status is not Status.OK)
