"""gather_node through the real LocalConnector (subprocesses on this machine): the sysfs script over a
test tree, stand-in tools first on PATH (tests/fabric/standins/standin-recorded-output printing real
fixture text), and the `rdma link` fallback when /sys/class/infiniband is not there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infer_ctl.checks.fabric import gather_node
from infer_ctl.core.fabric.expectations import expectations
from infer_ctl.core.fabric.rules import judge_node
from infer_ctl.core.findings import Status
from infer_ctl.profile import Profile
from infer_ctl.remote.local import LocalConnector
from tests.fabric.cluster_setup import install_standin
from tests.fabric.factories import FIX, PAUSE_OFF, QOS_PRIO3, devinfo_text
from tests.fabric.sysfs_tree import Netdev, build

PROFILE = Profile.model_validate({
    "name": "t",
    "nodes": [{"name": "pf-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"],
               "rdma": {"devices": ["mlx5_0"]}},
              {"name": "dc-01", "host": "127.0.0.2", "connection": "local", "roles": ["decode"]}],
    "fabric": {"counter_interval_s": 0},
})


def _tools(bin_dir: Path, outputs: dict[str, str]) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool, out in outputs.items():
        install_standin(bin_dir, tool, "standin-recorded-output")
        (bin_dir / f"{tool}.out").write_text(out)


def test_rdma_link_fallback_without_sysfs_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "sysfs"
    build(root, [], [Netdev("ens1f0np0")])  # class/net only: no class/infiniband
    link_json = (FIX / "rdma-link" / "FROM-FORMAT-rdma-j-link-show-2dev-roce.json").read_text()
    _tools(tmp_path / "bin", {"ibv_devinfo": devinfo_text([("mlx5_0", "Ethernet", 4096)]), "rdma": link_json,
                              "mlnx_qos": QOS_PRIO3, "ethtool": PAUSE_OFF})
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(root))
    node = PROFILE.node("pf-01")
    exp = expectations(PROFILE, node)
    facts = gather_node(LocalConnector("pf-01"), node, exp)
    assert facts.links and facts.netdevs_of("mlx5_0") == ["ens1f0np0"]
    assert (tmp_path / "bin" / "mlnx_qos.args").read_text().split() == ["-i", "ens1f0np0"]
    findings = {(f.check, f.subject): f for f in judge_node(facts, exp)}
    assert findings[("fabric.port_state", "mlx5_0/1")].status is Status.OK
    assert findings[("fabric.pfc", "ens1f0np0")].status is Status.OK
    assert findings[("fabric.netdev_mtu", "ens1f0np0")].status is Status.OK
    # no sysfs GID table and no GID lines in this devinfo text: reported as a failure, not guessed
    assert findings[("fabric.gid", "mlx5_0/1")].status is Status.FAIL


def test_dcb_when_mlnx_qos_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fabric.sysfs_tree import Hca

    root = tmp_path / "sysfs"
    build(root, [Hca()], [Netdev(trust=None)])
    dcb = tmp_path / "bin"
    _tools(dcb, {"ibv_devinfo": devinfo_text([("mlx5_0", "Ethernet", 4096)]), "ethtool": PAUSE_OFF,
                 "dcb": (FIX / "dcb" / "iproute2-manpage-dcb-pfc-show-example.txt").read_text()})
    monkeypatch.setenv("PATH", f"{dcb}{os.pathsep}/usr/bin{os.pathsep}/bin")  # no mlnx_qos anywhere
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(root))
    node = PROFILE.node("pf-01")
    exp = expectations(PROFILE, node)
    facts = gather_node(LocalConnector("pf-01"), node, exp)
    findings = {(f.check, f.subject): f for f in judge_node(facts, exp)}
    pfc = findings[("fabric.pfc", "ens1f0np0")]
    assert pfc.status is Status.FAIL and "on: 6, 7" in pfc.message and pfc.details["source"] == "dcb"
    calls = (dcb / "dcb.args").read_text().splitlines()
    assert calls[0] == "-j pfc show dev ens1f0np0" and calls[1] == "apptrust show dev ens1f0np0"
