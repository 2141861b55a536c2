"""Misconfigurations set up against the fabric check: each one must give a
precise finding naming the node, device/netdev and a remedy that fixes it. Facts come from the real
gatherer script over sysfs trees and real-format tool output (tests/fabric/factories.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infer_ctl.checks.fabric import gather_node
from infer_ctl.core.fabric.expectations import FabricExpectations, expectations
from infer_ctl.core.fabric.facts import GidEntry
from infer_ctl.core.fabric.gid import choose_gid, gid_family, is_link_local
from infer_ctl.core.fabric.rules import judge_gid_families, judge_node
from infer_ctl.core.findings import Finding, Status
from infer_ctl.facts.qos import parse_dcb_app_dscp, parse_mlnx_qos
from infer_ctl.profile import Profile
from infer_ctl.profile.fabric import FabricPolicy
from infer_ctl.remote.local import LocalConnector
from tests.fabric.cluster_setup import install_standin
from tests.fabric.factories import PAUSE_OFF, QOS_PRIO3, devinfo_text, node_facts
from tests.fabric.sysfs_tree import Hca, Netdev, build

POLICY = FabricPolicy(rate_gbps=400, netdev_mtu=9000)
EXP = FabricExpectations(POLICY, devices=("mlx5_0",), netdev="ens1f0np0")


def _bad(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status not in (Status.OK, Status.SKIP)]


def test_link_down_names_the_netdev_in_message_and_remedy(tmp_path: Path) -> None:
    [f] = _bad(judge_node(node_facts(tmp_path, [Hca(state="1: DOWN", phys_state="3: Disabled")]), EXP))
    assert (f.check, f.node, f.subject, f.status) == ("fabric.port_state", "pf-01", "mlx5_0/1", Status.FAIL)
    assert "netdev ens1f0np0" in f.message and "ip link set ens1f0np0 up" in (f.remedy or "")


def test_pfc_on_two_priorities_and_on_the_wrong_one(tmp_path: Path) -> None:
    two = QOS_PRIO3.replace("enabled     0   0   0   1", "enabled     0   0   1   1")
    [f] = _bad(judge_node(node_facts(tmp_path / "a", qos=two), EXP))
    assert f.status is Status.WARN and "2, 3" in f.message and "--pfc 0,0,0,1,0,0,0,0" in (f.remedy or "")
    wrong = QOS_PRIO3.replace("enabled     0   0   0   1   0   0", "enabled     0   0   0   0   0   1")
    [f] = _bad(judge_node(node_facts(tmp_path / "b", qos=wrong), EXP))
    assert f.status is Status.FAIL and f.message == "PFC is off on priority 3 (on: 5)"


def test_netdev_typo_in_profile_is_named_once(tmp_path: Path) -> None:
    exp = FabricExpectations(POLICY, devices=("mlx5_0",), netdev="ens1f0")
    [f] = _bad(judge_node(node_facts(tmp_path), exp))
    assert (f.check, f.subject, f.status) == ("fabric.netdev", "ens1f0", Status.FAIL)
    assert "ens1f0np0" in f.message and f.remedy == "set nodes[].rdma.netdev to ens1f0np0 for pf-01"


def test_netdev_gone_is_one_failure_not_install_advice(tmp_path: Path) -> None:
    bad = _bad(judge_node(node_facts(tmp_path, netdevs=[]), EXP))
    assert [(f.check, f.subject, f.status) for f in bad] == [("fabric.netdev", "ens1f0np0", Status.FAIL)]
    assert "install" not in (bad[0].remedy or "")


def test_qos_tool_failing_is_not_reported_as_missing(tmp_path: Path) -> None:
    facts = node_facts(tmp_path)
    nd = facts.netdevs["ens1f0np0"]
    nd.qos, nd.qos_error = None, "mlnx_qos -i ens1f0np0 failed: Operation not permitted"
    nd.pause, nd.pause_error = None, "ethtool -a ens1f0np0 failed: Operation not supported"
    by = {f.check: f for f in _bad(judge_node(facts, EXP))}
    assert by["fabric.pfc"].status is Status.UNKNOWN and "mlnx_qos -i ens1f0np0" in (by["fabric.pfc"].remedy or "")
    assert "install" not in (by["fabric.pfc"].remedy or "") and "install" not in (by["fabric.pause"].remedy or "")


@pytest.mark.parametrize(
    ("deltas", "status", "text"),
    [
        ({"rx_prio3_pause": 0, "tx_prio3_pause": 0}, Status.OK, "no PFC pause frames"),
        ({"rx_prio3_pause": 120, "tx_prio3_pause": 0}, Status.WARN, "priority 3 grew"),
        ({"rx_prio0_pause": 7, "rx_prio3_pause": 1}, Status.FAIL, "priority 0"),
        (None, Status.SKIP, "not read"),
    ],
)
def test_per_priority_pause_counters(tmp_path: Path, deltas: dict[str, int] | None, status: Status, text: str) -> None:
    facts = node_facts(tmp_path)
    nd = facts.netdevs["ens1f0np0"]
    nd.pause_deltas, nd.pause_interval_s = deltas, 2.0
    nd.pause_counters_error = None if deltas is not None else "ethtool -S shows no rx/tx_prio<N>_pause counters"
    [f] = [f for f in judge_node(facts, EXP) if f.check == "fabric.pfc_pauses"]
    assert f.status is status and text in f.message and f.subject == "ens1f0np0", f


def test_gid_scoring_follows_perftest_link_local_rules() -> None:
    # perftest's is_gid_link_local(): 169.254/16 inside an IPv4-mapped GID is link-local too
    assert is_link_local("::ffff:169.254.3.4") and not is_link_local("::ffff:10.0.0.1")
    assert gid_family("ff0e::ffff:239.1.1.1") == "ipv4"  # ipv6_addr_v4mapped()'s multicast form
    gids = [GidEntry(0, "fe80::1", "RoCE v2"), GidEntry(1, "::ffff:169.254.3.4", "RoCE v2"),
            GidEntry(2, "2001:db8::1", "RoCE v2")]
    best = choose_gid(gids)
    assert best is not None and (best.index, best.score, best.link_local) == (1, 102, True)
    assert choose_gid(gids, "ipv6").index == 2  # type: ignore[union-attr]


def test_ipv6_preference_from_the_profile(tmp_path: Path) -> None:
    v6 = [(0, "fe80::1", "IB/RoCE v1"), (1, "fe80::1", "RoCE v2"), (2, "::ffff:10.0.0.11", "RoCE v2"),
          (3, "2001:db8::11", "RoCE v2")]
    facts = node_facts(tmp_path, [Hca(gids=v6)])
    exp6 = FabricExpectations(FabricPolicy(rate_gbps=400, netdev_mtu=9000, gid_family="ipv6"), devices=("mlx5_0",))
    gid = {f.check: f for f in judge_node(facts, exp6)}["fabric.gid"]
    assert gid.details["index"] == 3 and gid.details["family"] == "ipv6"
    assert {f.check: f for f in judge_node(facts, EXP)}["fabric.gid"].details["index"] == 2


def test_even_family_split_blames_the_node_off_the_preferred_family() -> None:
    [a, b] = judge_gid_families({"pf-01": {"ipv4"}, "dc-01": {"ipv6"}})
    assert (a.node, a.status, b.node, b.status) == ("pf-01", Status.OK, "dc-01", Status.FAIL)
    [a, b] = judge_gid_families({"pf-01": {"ipv4"}, "dc-01": {"ipv6"}}, prefer="ipv6")
    assert (a.status, b.status) == (Status.FAIL, Status.OK) and "ipv4 differs" in a.message


def test_dcb_app_table_with_iproute2_dscp_names() -> None:
    # without -N, dcb prints rt_dsfield names: AF31 is DSCP 26, the usual RoCE DSCP
    assert parse_dcb_app_dscp("dscp-prio default:0 AF31:3 CS6:6 EF:5 \n") == {0: 0, 26: 3, 48: 6, 46: 5}


def test_mlnx_qos_trust_none_is_unknown_not_a_wrong_mode() -> None:
    qos = parse_mlnx_qos(QOS_PRIO3.replace("Priority trust state: dscp", "Priority trust state: none"))
    assert qos.trust is None and qos.pfc_priorities == [3]


PROFILE = Profile.model_validate({
    "name": "t",
    "nodes": [{"name": "pf-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"],
               "rdma": {"devices": ["mlx5_0"], "netdev": "ens1f0np0"}},
              {"name": "dc-01", "host": "127.0.0.2", "connection": "local", "roles": ["decode"]}],
    "fabric": {"counter_interval_s": 0.1},
})


def _ethtool_s(rx3: int, rx0: int) -> str:
    return ("NIC statistics:\n     rx_packets: 10\n"
            f"     rx_prio0_pause: {rx0}\n     tx_prio0_pause: 0\n     rx_prio3_pause: {rx3}\n     tx_prio3_pause: 5\n")


def test_gather_samples_pause_counters_twice_and_uses_numeric_dcb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real LocalConnector: ethtool -S read twice around the counter interval, dcb -N app."""
    root = tmp_path / "sysfs"
    build(root, [Hca()], [Netdev(trust=None)])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    outputs = {"ibv_devinfo.out": devinfo_text([("mlx5_0", "Ethernet", 4096)]), "ethtool.out": PAUSE_OFF,
               "ethtool.S.1.out": _ethtool_s(100, 0), "ethtool.S.2.out": _ethtool_s(160, 4),
               "dcb.j.out": '{"pfc_cap":8,"macsec_bypass":false,"delay":4096,"prio_pfc":[false,false,false,true,false,false,false,false]}',
               "dcb.N.out": "dscp-prio 26:3 48:6 \n", "dcb.apptrust.out": ""}
    for tool in ("ibv_devinfo", "ethtool", "dcb"):
        install_standin(bin_dir, tool, "standin-recorded-output")
    for name, text in outputs.items():
        (bin_dir / name).write_text(text)
    (bin_dir / "dcb.rc").write_text("0")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(root))
    node = PROFILE.node("pf-01")
    exp = expectations(PROFILE, node)
    facts = gather_node(LocalConnector("pf-01"), node, exp)
    nd = facts.netdevs["ens1f0np0"]
    assert nd.pause_deltas == {"rx_prio3_pause": 60, "rx_prio0_pause": 4}
    assert nd.dcb_trust == "dscp" and nd.qos is not None and nd.qos.pfc_priorities == [3]
    assert "-N app show dev ens1f0np0 dscp-prio" in (bin_dir / "dcb.args").read_text()
    [f] = [f for f in judge_node(facts, exp) if f.check == "fabric.pfc_pauses"]
    assert f.status is Status.FAIL and "priority 0" in f.message and "rx_prio0_pause +4" in f.message
