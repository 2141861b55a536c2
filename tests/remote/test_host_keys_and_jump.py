"""Host key policy and jump hosts against real sshd nodes."""

from __future__ import annotations

import pytest

from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import HostKeyChangedError, HostKeyUnknownError, UnreachableError
from infer_ctl.remote.fleet import Fleet
from tests.remote.helpers import profile_of, run_json

pytestmark = pytest.mark.ssh


def test_unknown_host_key_is_refused_with_fingerprint_then_accepted_with_the_flag(
    ssh_cluster, capsys, tmp_path
):
    cluster = ssh_cluster(2)
    cluster.write_known_hosts(names=["node-01"])  # node-02's key is unknown
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "true")
    assert code == 3
    refused = doc["results"][1]
    assert (
        "unknown host key" in refused["error"] and cluster.host_key_fingerprint("node-02") in refused["error"]
    )
    assert not cluster.accepted_known_hosts.exists()

    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--accept-new-host-keys", "--", "true")
    assert code == 0, doc
    recorded = cluster.accepted_known_hosts.read_text()
    assert cluster.host_key_line("node-02") in recorded and "node-01" not in recorded
    assert cluster.known_hosts.read_text().count("\n") == 1  # the user's file is never written

    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "true")
    assert code == 0  # remembered without the flag


def test_host_key_policy_accept_new_in_the_profile_records_too(ssh_cluster):
    cluster = ssh_cluster(1)
    cluster.known_hosts.write_text("")
    with Fleet(profile_of(cluster, ssh={"host_key_policy": "accept-new"})) as fleet:
        assert fleet.connector(fleet.profile.nodes[0]).run(Command("true")).ok
    assert cluster.host_key_line("node-01") in cluster.accepted_known_hosts.read_text()


def test_changed_host_key_is_refused_even_with_accept_new_and_names_the_line(ssh_cluster):
    cluster = ssh_cluster(2)
    cluster.regenerate_host_key("node-02")  # known_hosts still has the old key on line 2
    with Fleet(profile_of(cluster), accept_new_host_keys=True) as fleet:
        outcomes = fleet.map(fleet.profile.nodes, lambda conn, node: conn.run(Command("true")))
    assert outcomes[0].ok
    error = outcomes[1].error
    assert isinstance(error, HostKeyChangedError)
    assert "HOST KEY CHANGED" in error.message and f"{cluster.known_hosts} line 2" in error.message
    assert "ssh-keygen -R" in (error.remedy or "")
    assert error.exit_code == 2
    assert not cluster.accepted_known_hosts.exists()


def test_unknown_key_error_type(ssh_cluster):
    cluster = ssh_cluster(1)
    cluster.known_hosts.write_text("# nothing here\n")
    with Fleet(profile_of(cluster)) as fleet, pytest.raises(HostKeyUnknownError) as info:
        fleet.connector(fleet.profile.nodes[0])
    assert info.value.fingerprint == cluster.host_key_fingerprint("node-01")
    assert "--accept-new-host-keys" in (info.value.remedy or "")


def _jump_setup(ssh_cluster, bastion_config: str = ""):
    bastion = ssh_cluster(1, names=["bastion"], extra_sshd_config=bastion_config)
    inner = ssh_cluster(2)
    # one key and one known_hosts for both clusters
    (bastion.root / "authorized_keys").write_text((inner.root / "user_key.pub").read_text())
    inner.known_hosts.write_text(inner.known_hosts.read_text() + bastion.host_key_line("bastion") + "\n")
    hop = bastion.node("bastion")
    profile = profile_of(inner, ssh={"jump_host": f"{inner.user}@{hop.host}:{hop.port}"})
    return bastion, inner, profile


def test_nodes_are_reached_through_a_jump_host(ssh_cluster):
    bastion, _, profile = _jump_setup(ssh_cluster)
    with Fleet(profile) as fleet:
        outcomes = fleet.map(
            profile.nodes, lambda conn, node: conn.run(Command.sh("echo $INFERCTL_TEST_NODE"))
        )
    assert [o.value.out.strip() for o in outcomes if o.value] == ["node-01", "node-02"]
    # both nodes share one connection to the bastion
    assert bastion.sshd_log("bastion").read_text().count("Accepted publickey") == 1


def test_a_jump_host_that_forbids_forwarding_is_named_in_the_error(ssh_cluster):
    _, _, profile = _jump_setup(ssh_cluster, "AllowTcpForwarding no")
    with Fleet(profile) as fleet:
        outcomes = fleet.map(profile.nodes, lambda conn, node: conn.run(Command("true")))
    for o in outcomes:
        assert isinstance(o.error, UnreachableError)
        assert "jump host" in o.error.message and "AllowTcpForwarding" in (o.error.remedy or "")
