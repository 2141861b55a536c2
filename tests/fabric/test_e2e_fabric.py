"""`inferctl check fabric` end to end over real sshd nodes (tests/sshd_harness.py).

Real: sshd, the SSH connector and fleet, the gatherer shell scripts run by the node's /bin/sh over
sysfs-shaped trees, the pair-test orchestration (detached server, readiness on the server's
/proc/net/tcp, client under timeout, collection and cleanup), TCP between the nodes, and the CLI.
Stand-ins (tests/fabric/standins): ibv_rc_pingpong (a real TCP server/client speaking rc_pingpong's
exchange and output formats), and ibv_devinfo / mlnx_qos / ethtool printing recorded real-format text.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.checks.registry import load_family
from infer_ctl.cli.main import main
from tests.fabric.cluster_setup import (
    FabricNode,
    fabric_profile,
    free_port_range,
    leftovers,
    new_pp_dirs,
    pp_dirs,
    setup_node,
)
from tests.fabric.factories import FIX
from tests.fabric.sysfs_tree import Netdev

pytestmark = pytest.mark.ssh

PCP_NO_PFC = (FIX / "mlnx_qos" / "magnate3-cx-ens6-trust-pcp-default.txt").read_text()


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", "fabric", *args])
    return code, capsys.readouterr().out


def _by(findings: list[dict[str, Any]], check: str, node: str | None = None) -> list[dict[str, Any]]:
    return [f for f in findings if f["check"] == check and (node is None or f["node"] == node)]


def test_healthy_and_misconfigured_nodes_with_pair_matrix(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ssh_cluster(names=["pf-01", "dc-01", "dc-02"], roles=[["prefill"], ["decode"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    setup_node(cluster, sysfs, "pf-01", FabricNode(ipv4="10.0.0.11"))
    setup_node(cluster, sysfs, "dc-01", FabricNode(ipv4="10.0.0.21"))
    # dc-02: PFC off and trust pcp (mlnx_qos), ECN off on priority 3, an IPv6 GID while the fleet is IPv4
    setup_node(cluster, sysfs, "dc-02", FabricNode(ipv4=None, ipv6="2001:db8::22", qos=PCP_NO_PFC,
                                                   netdev=Netdev(trust=None, ecn_np={3: 0}, ecn_rp={3: 0})))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range(), pingpong={"perftest": True})
    before = pp_dirs()

    code, out = _cli(capsys, "--pingpong", "--json", "-p", str(profile))
    doc = json.loads(out)
    findings = doc["findings"]
    assert code == 2 and doc["status"] == "fail"
    problems = {(f["check"], f["node"]) for f in findings if f["status"] in ("fail", "warn", "unknown")}
    assert problems == {
        ("fabric.pfc", "dc-02"), ("fabric.trust", "dc-02"), ("fabric.ecn", "dc-02"), ("fabric.gid_family", "dc-02"),
        ("fabric.pingpong", "pf-01"), ("fabric.write_lat", "pf-01"),  # the pf-01 <-> dc-02 pair
    }, problems
    lat = {f["details"]["client"]: f for f in _by(findings, "fabric.write_lat")}
    assert lat["dc-01"]["status"] == "ok" and lat["dc-01"]["details"]["rtt_us"] > 0
    assert lat["dc-02"]["status"] == "fail" and "retry counter exceeded" in lat["dc-02"]["message"]
    ok_pair = _by(findings, "fabric.pingpong", "pf-01")
    by_client = {f["details"]["client"]: f for f in ok_pair}
    assert by_client["dc-01"]["status"] == "ok" and by_client["dc-01"]["details"]["rtt_us"] > 0
    assert by_client["dc-01"]["details"]["server_gid_index"] == 3  # chosen like perftest, not configured
    bad = by_client["dc-02"]
    assert bad["status"] == "fail" and "transport retry counter exceeded" in bad["message"]
    assert "pf-01" in bad["subject"] and "dc-02" in bad["subject"] and "GID index" in bad["remedy"]
    assert "PFC is off on priority 3" in _by(findings, "fabric.pfc", "dc-02")[0]["message"]
    pairs = doc["pairs"]
    assert pairs["tools"] == ["ibv_rc_pingpong", "ib_write_lat"]
    assert pairs["rows"] == ["pf-01"] and pairs["columns"] == ["dc-01", "dc-02"]
    assert {(c["client"], c["status"]) for c in pairs["cells"]} == {("dc-01", "ok"), ("dc-02", "fail")}
    # both ends got the same flags (-d/-g are each side's own; the client adds the server's address)
    server_args = (cluster.bin_dir("pf-01") / "ibv_rc_pingpong.args").read_text().split("\n")[0].split()
    client_args = (cluster.bin_dir("dc-01") / "ibv_rc_pingpong.args").read_text().split("\n")[0].split()
    # the client connects to the server's data-plane address: its RoCE v2 GID's IPv4, not the profile's host
    assert client_args[:-1] == server_args and client_args[-1] == "10.0.0.11"
    assert by_client["dc-01"]["details"]["server_address"] == "10.0.0.11"
    assert by_client["dc-01"]["details"]["server_address_source"] == "gid"
    assert server_args[server_args.index("-g") + 1] == "3" and server_args[server_args.index("-m") + 1] == "4096"
    # the servers were stopped and their temp dirs removed
    assert leftovers(cluster.root) == [] and new_pp_dirs(before) == set()
    assert _by(findings, "fabric.counters", "pf-01")[0]["status"] == "ok"


def test_client_that_never_connects_times_out_and_server_is_cleaned_up(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    setup_node(cluster, sysfs, "pf-01", FabricNode(ipv4="10.0.0.11"))
    setup_node(cluster, sysfs, "dc-01", FabricNode(ipv4="10.0.0.21", mode="no-connect"))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range(), pingpong={"timeout_s": 1.5})
    before = pp_dirs()
    started = time.monotonic()
    code, out = _cli(capsys, "--pingpong", "--json", "-p", str(profile))
    elapsed = time.monotonic() - started
    pair = _by(json.loads(out)["findings"], "fabric.pingpong")[0]
    assert code == 2 and pair["status"] == "fail" and "timed out (client)" in pair["message"]
    assert "firewall" in pair["remedy"] and str(pair["details"]["tcp_port"]) in pair["remedy"]
    assert elapsed < 15
    assert leftovers(cluster.root) == [] and new_pp_dirs(before) == set()


def test_no_rdma_hardware_real_tools_and_unreachable_node(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """pf-01 has no stand-ins: the machine's own ibv_devinfo runs (or is missing) and /sys has no HCA."""
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    monkeypatch.delenv("INFERCTL_SYSFS_ROOT", raising=False)
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range())
    cluster.stop("dc-01")
    code, out = _cli(capsys, "--pingpong", "-p", str(profile))
    out = " ".join(out.replace("│", " ").split())  # the table wraps long messages
    assert code == 2
    assert "no RDMA device found" in out and "fabric.devices" in out
    if shutil.which("ibv_devinfo"):  # .ci/run installs ibverbs-utils: the real tool's own words
        assert "Function not implemented" in out or "No IB devices" in out
    else:
        assert "not installed" in out
    assert "fabric.node" in out  # dc-01 unreachable: UNKNOWN, named
    assert "cannot take part in pair tests" in out
    assert "Traceback" not in out


def test_fabric_family_is_loadable_for_audit() -> None:
    family = load_family("infer_ctl.checks.fabric")
    assert family.name == "fabric" and family.needs_nodes


def test_audit_runs_the_fabric_family(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    setup_node(cluster, sysfs, "pf-01", FabricNode(ipv4="10.0.0.11"))
    setup_node(cluster, sysfs, "dc-01", FabricNode(ipv4="10.0.0.21", pause=(FIX / "ethtool-a" / "ethtool-commit-7e5c1d-a-json.json").read_text()))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range())
    capsys.readouterr()
    code = main(["audit", "-p", str(profile), "--json", "--only", "fabric"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    bad = {(f["check"], f["node"]) for f in findings if f["status"] != "ok" and f["status"] != "skip"}
    assert code == 2 and bad == {("fabric.pause", "dc-01")}
    assert not _by(findings, "fabric.pingpong")  # pair tests only when asked for


def test_write_bandwidth_pair_test_end_to_end(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """fabric.pingpong.bandwidth: ib_write_bw runs after ib_write_lat with the same flags on both ends,
    the client's BW average row is judged against min_bw_fraction x the slower link rate (sysfs rate)."""
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    setup_node(cluster, sysfs, "pf-01", FabricNode(ipv4="10.0.0.11"))
    setup_node(cluster, sysfs, "dc-01", FabricNode(ipv4="10.0.0.21"))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    # the stand-in moves bytes over loopback TCP, far below 400 Gb/s: a tiny fraction keeps the verdict OK
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range(),
                             pingpong={"perftest": True, "bandwidth": True, "min_bw_fraction": 0.0001})
    before = pp_dirs()
    code, out = _cli(capsys, "--pingpong", "--json", "-p", str(profile))
    doc = json.loads(out)
    assert doc["pairs"]["tools"] == ["ibv_rc_pingpong", "ib_write_lat", "ib_write_bw"]
    [bw] = _by(doc["findings"], "fabric.write_bw")
    assert bw["status"] == "ok" and bw["details"]["bw_average_gbps"] > 0 and bw["details"]["link_gbps"] == 400
    assert "pf-01 (mlx5_0) and dc-01 (mlx5_0)" in bw["message"]
    server = (cluster.bin_dir("pf-01") / "ib_write_bw.args").read_text().split()
    client = (cluster.bin_dir("dc-01") / "ib_write_bw.args").read_text().split()
    assert client[:-1] == server and "--report_gbits" in server and server[server.index("-x") + 1] == "3"
    assert code == 0 and leftovers(cluster.root) == [] and new_pp_dirs(before) == set()
    # the same run as a table: exit code 0 and the pair matrix (rows prefill, columns decode)
    code, table = _cli(capsys, "--pingpong", "-p", str(profile))
    flat = " ".join(table.replace("│", " ").split())  # the title wraps in a narrow terminal
    assert code == 0 and "pair tests (prefill-decode:" in flat and "pf-01" in flat and "dc-01" in flat and " us" in flat


def _alias_profile(cluster: Any, tmp_path: Path, base_port: int, **pingpong: Any) -> Path:
    """The profile names every node by a ~/.ssh/config alias (`pf-01.ic`), as a fleet whose ssh config
    maps short names to management addresses does; only the controller knows the aliases."""
    config = tmp_path / "ssh_config"
    config.write_text("".join(
        f"Host {n.name}.ic\n  HostName {n.host}\n  Port {n.port}\n" for n in cluster.nodes))
    path = fabric_profile(cluster, tmp_path / "p.yaml", base_port, pingpong=pingpong)
    import yaml

    data = yaml.safe_load(path.read_text())
    data["ssh"]["config_file"] = str(config)
    for node in data["nodes"]:
        node["host"], node["port"] = f"{node['name']}.ic", None
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_pair_tests_with_ssh_config_aliases_use_the_data_plane_address_and_show_every_pair(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The client used to get the alias (`pf-01.ic`): every pair failed with 'Name or service not
    known' and the remedy blamed GID/PFC/MTU. The client now gets the server's RoCE v2 GID's IPv4; an
    unreachable decode node is a 'not run' cell in the matrix, with its reason."""
    cluster = ssh_cluster(names=["pf-01", "dc-01", "dc-02"], roles=[["prefill"], ["decode"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    for name, ip in (("pf-01", "10.0.0.11"), ("dc-01", "10.0.0.21"), ("dc-02", "10.0.0.22")):
        setup_node(cluster, sysfs, name, FabricNode(ipv4=ip))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = _alias_profile(cluster, tmp_path, free_port_range(), perftest=True)
    cluster.stop("dc-02")
    code, out = _cli(capsys, "--pingpong", "--json", "-p", str(profile))
    doc = json.loads(out)
    pairs = {(f["check"], f["details"]["client"]): f for f in doc["findings"] if "client" in f["details"]}
    for check in ("fabric.pingpong", "fabric.write_lat"):
        f = pairs[(check, "dc-01")]
        assert f["status"] == "ok", f
        assert f["details"]["server_address"] == "10.0.0.11" and f["details"]["server_address_source"] == "gid"
    client_args = (cluster.bin_dir("dc-01") / "ibv_rc_pingpong.args").read_text().split()
    assert client_args[-1] == "10.0.0.11" and "pf-01.ic" not in client_args
    cells = {(c["server"], c["client"]): c for c in doc["pairs"]["cells"]}
    assert doc["pairs"]["rows"] == ["pf-01"] and doc["pairs"]["columns"] == ["dc-01", "dc-02"]
    assert cells[("pf-01", "dc-01")]["status"] == "ok"
    assert cells[("pf-01", "dc-02")] == {"server": "pf-01", "client": "dc-02", "status": "unknown",
                                         "text": "not run", "reason": "dc-02 not reachable"}
    assert code == 2  # dc-02 cannot take part (fabric.pingpong FAIL on dc-02), the rest passed
    # the table shows the cell too
    code, table = _cli(capsys, "--pingpong", "-p", str(profile))
    assert "not run" in " ".join(table.replace("│", " ").split())


def test_a_server_without_an_ipv4_gid_is_reached_at_its_ssh_config_hostname(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    for name, ip6 in (("pf-01", "2001:db8::11"), ("dc-01", "2001:db8::21")):
        setup_node(cluster, sysfs, name, FabricNode(ipv4=None, ipv6=ip6))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = _alias_profile(cluster, tmp_path, free_port_range(), pairs="prefill-decode")
    code, out = _cli(capsys, "--pingpong", "--json", "-p", str(profile), "--pairs", "prefill-decode")
    (pair,) = [f for f in json.loads(out)["findings"] if f["check"] == "fabric.pingpong"]
    assert pair["status"] == "ok", pair
    assert pair["details"]["server_address"] == cluster.node("pf-01").host
    assert pair["details"]["server_address_source"] == "ssh_config" and code == 0


def test_a_nic_trained_narrower_than_its_slot_fails_over_real_sshd(
    ssh_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The NIC's PCI function files in the node's sysfs tree (kernel formats): dc-01's ConnectX trained at
    x8 of x16, pf-01's at the full Gen5 x16."""
    cluster = ssh_cluster(names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    setup_node(cluster, sysfs, "pf-01", FabricNode(ipv4="10.0.0.11"))
    narrow = {"current_link_width": "8", "max_link_width": "16",
              "current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe"}
    setup_node(cluster, sysfs, "dc-01", FabricNode(ipv4="10.0.0.21", hca={"pcie": narrow}))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range())
    code, out = _cli(capsys, "--json", "-p", str(profile))
    nic = {f["node"]: f for f in json.loads(out)["findings"] if f["check"] == "fabric.nic_pcie"}
    assert nic["pf-01"]["status"] == "ok" and nic["pf-01"]["message"] == "PCIe x16 at 32 GT/s"
    assert nic["dc-01"]["status"] == "fail" and "x8 of x16" in nic["dc-01"]["message"]
    assert nic["dc-01"]["code"] == "IC-FAB-021" and code == 2
