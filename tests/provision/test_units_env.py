"""The units step writes the env files launch writes: the GID index read from the node's GID table when
the profile pins none, the same bytes and the same mode, so `provision --apply --restart` keeps
MC_GID_INDEX and a launch after a provision (or the other way round) changes nothing.

Real: sshd nodes with private /etc (conftest.py), the sysfs gatherer reading a sysfs-shaped tree in
kernel formats (tests/fabric/sysfs_tree.py) through INFERCTL_SYSFS_ROOT, launch's own prepare step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer_ctl.launch import deploy, orchestrate
from infer_ctl.launch.render import instances
from infer_ctl.profile.load import load_profile
from infer_ctl.remote.fleet import Fleet
from tests.fabric.sysfs_tree import Hca, Netdev, build
from tests.provision.conftest import NETDEV
from tests.provision.test_provision_e2e import entries, run_cli

pytestmark = pytest.mark.ssh

E810 = [(0, "fe80::3efd:feff:fe9d:1a2b", "IB/RoCE v1"), (1, "::ffff:10.0.0.11", "RoCE v2"),
        (2, "fe80::3efd:feff:fe9d:1a2b", "RoCE v2")]  # fmt: skip


def _unpinned(pc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gids: list[Any]) -> Path:
    node = pc.cluster.names[0]
    build(tmp_path / node / "sys", [Hca(netdev=NETDEV, gids=gids)], [Netdev(NETDEV)])
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(tmp_path / "{node}" / "sys"))
    data = pc.cluster.profile_data()
    nodes = [{**n, "gpus": 2, "roles": ["prefill", "decode"], "rdma": {"devices": ["mlx5_0"], "netdev": NETDEV}}
             for n in data["nodes"]]  # fmt: skip
    return pc.profile(nodes=nodes, sglang={"lifecycle": {"supervisor": "systemd"}})


def test_provision_renders_the_probed_gid_index_and_launch_then_changes_nothing(
    prov_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile_path = _unpinned(pc, tmp_path, monkeypatch, E810)
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "--restart", "--only", "units", "-p", str(profile_path))
    assert code == 0, doc
    env = pc.node_path(node, "/etc/inferctl/sglang-prefill.env")
    assert "MC_GID_INDEX=1\n" in env.read_text()  # the E810's RoCE v2 IPv4 GID, not Mooncake's default 3
    assert oct(env.stat().st_mode & 0o777) == "0o600"

    profile = load_profile(str(profile_path))
    mine = [i for i in instances(profile) if i.node == node]
    with Fleet(profile) as fleet:
        [out] = fleet.map(profile.nodes, lambda c, n: [deploy.deployment(c, profile, i, "systemd") for i in mine])
        assert out.value is not None, out.error
        for plan in out.value:
            for f in plan.files:
                assert pc.node_path(node, f.path).read_text() == f.text
        # launch's own prepare step: nothing to write after provision
        [prep] = fleet.map(profile.nodes, lambda c, n: orchestrate.prepare_node(c, profile, mine))
        assert prep.value is not None, prep.error
        assert [p.changed for p in prep.value] == [[], []]
    # ... and the plan after launch is still empty (no mode flapping between 0600 and 0640)
    code, doc = run_cli(capsys, "provision", "--only", "units", "-p", str(profile_path))
    assert code == 0, [e for e in entries(doc) if e["kind"] != "ok"]


def test_undeterminable_gid_index_is_an_error_and_no_env_file_is_written(
    prov_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile_path = _unpinned(pc, tmp_path, monkeypatch, [(0, "fe80::1", "IB/RoCE v1"), (1, "::ffff:10.0.0.11", "IB/RoCE v1")])
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "--only", "units", "-p", str(profile_path))
    assert code == 2
    errors = [e for e in entries(doc) if e["kind"] == "error"]
    assert {e["subject"] for e in errors} == {"/etc/inferctl/sglang-prefill.env", "/etc/inferctl/sglang-decode.env"}
    assert "MC_GID_INDEX cannot be determined: mlx5_0/1 has no RoCE v2 ipv4 GID" in errors[0]["summary"]
    assert not pc.node_path(node, "/etc/inferctl/sglang-prefill.env").exists()
