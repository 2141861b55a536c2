"""The sshd harness itself: nodes answer over real SSH, PATH puts bin_dir first, stop/start works."""

from __future__ import annotations

import socket

import pytest

from infer_ctl.profile.load import validate_profile_data
from infer_ctl.remote.base import Command
from infer_ctl.remote.fleet import Fleet

pytestmark = pytest.mark.ssh


def test_harness_profile_is_valid_and_nodes_answer_with_their_own_path(ssh_cluster):
    cluster = ssh_cluster(2)
    cluster.add_executable("node-02", "standin-tool", "echo standin on $INFERCTL_TEST_NODE\n")
    profile = validate_profile_data(cluster.profile_data())
    assert [n.roles[0].value for n in profile.nodes] == ["prefill", "decode"]
    with Fleet(profile) as fleet:
        conn = fleet.connector(profile.nodes[1])
        assert conn.run(Command("standin-tool")).out == "standin on node-02\n"
        path = conn.run(Command.sh("echo $PATH")).out
        assert path.startswith(str(cluster.bin_dir("node-02")) + ":")
        missing = fleet.connector(profile.nodes[0]).run(Command("standin-tool"))
        assert missing.exit_code == 127


def test_stop_makes_one_node_refuse_connections_and_start_brings_it_back(ssh_cluster):
    cluster = ssh_cluster(2)
    node = cluster.node("node-01")
    cluster.stop("node-01")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((node.host, node.port), timeout=2).close()
    cluster.start("node-01")
    with socket.create_connection((node.host, node.port), timeout=2) as s:
        assert s.recv(4) == b"SSH-"


def test_profile_overrides_merge_into_sections(ssh_cluster):
    cluster = ssh_cluster(3)
    data = cluster.profile_data(ssh={"parallelism": 4}, name="other")
    assert data["ssh"]["parallelism"] == 4 and data["ssh"]["identity_file"] == str(cluster.identity_file)
    assert data["name"] == "other"
    assert [n["roles"] for n in data["nodes"]] == [["prefill"], ["decode"], ["decode"]]
    assert cluster.host_key_fingerprint("node-01").startswith("SHA256:")
