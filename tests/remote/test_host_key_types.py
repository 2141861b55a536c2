"""Host keys across key types, hashed names, markers and the known_hosts files ~/.ssh/config names,
against real sshd nodes serving ed25519, ecdsa and RSA host keys (and, for reference, OpenSSH's own
`ssh -o StrictHostKeyChecking=accept-new` against the same nodes)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import os
import shutil
import subprocess

import pytest

from infer_ctl.remote.hostkeys import known_hosts_name
from tests.remote.helpers import run_json
from tests.sshd_harness import HOST_KEY_TYPES, generate_keypair

pytestmark = pytest.mark.ssh

TYPE_PAIRS = [(a, b) for a, b in itertools.product(HOST_KEY_TYPES, repeat=2) if a != b]


def _hashed(name: str) -> str:
    """A hashed known_hosts name (`ssh-keygen -H`): |1|base64(salt)|base64(HMAC-SHA1(salt, name))."""
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def _openssh_accept_new(cluster, name: str, known_hosts) -> subprocess.CompletedProcess[str]:
    """What OpenSSH's client does with the same node and known_hosts under accept-new."""
    node = cluster.node(name)
    return subprocess.run(
        ["ssh", "-F", "/dev/null", "-o", "StrictHostKeyChecking=accept-new", "-o", "BatchMode=yes",
         "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
         "-o", "ConnectTimeout=5", "-i", str(cluster.identity_file), "-p", str(node.port),
         f"{cluster.user}@{node.host}", "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(("known", "offered"), TYPE_PAIRS, ids=[f"{a}-then-{b}" for a, b in TYPE_PAIRS])
def test_a_key_of_another_type_is_a_change_even_with_accept_new(ssh_cluster, capsys, tmp_path, known, offered):
    cluster = ssh_cluster(1, host_key_types=(known,))  # known_hosts records the node's `known` key
    recorded = cluster.known_hosts.read_text()
    cluster.replace_host_keys("node-01", [offered])  # the node (or an impostor) now has only `offered`
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--accept-new-host-keys", "--", "true")
    error = doc["results"][0]["error"] or ""
    assert code == 2, doc
    assert "HOST KEY CHANGED" in error and "another type" in error, error
    assert cluster.host_key_fingerprint("node-01") in error
    assert f"{cluster.known_hosts} line 1" in error
    assert not cluster.accepted_known_hosts.exists(), "a key of another type was recorded"
    assert cluster.known_hosts.read_text() == recorded
    if shutil.which("ssh"):  # the reference: OpenSSH refuses exactly this too
        proc = _openssh_accept_new(cluster, "node-01", cluster.known_hosts)
        assert proc.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in proc.stderr, proc.stderr


@pytest.mark.parametrize("key_type", HOST_KEY_TYPES)
def test_a_node_with_several_keys_proves_the_recorded_type(ssh_cluster, capsys, tmp_path, key_type):
    """Only one of the node's keys is recorded: the handshake must ask for that type (an RSA key is
    recorded as ssh-rsa but negotiated as rsa-sha2-*), not call the node changed or unknown."""
    cluster = ssh_cluster(1, host_key_types=HOST_KEY_TYPES)
    cluster.known_hosts.write_text(cluster.host_key_line("node-01", key_type) + "\n")
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "true")
    assert code == 0, doc["results"][0]["error"]


def test_hashed_entries_are_matched_for_the_same_and_for_another_type(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(2)
    lines = []
    for name in ("node-01", "node-02"):
        node = cluster.node(name)
        _, key_type, blob = cluster.host_key_line(name).split()
        lines.append(f"{_hashed(known_hosts_name(node.host, node.port))} {key_type} {blob}\n")
    cluster.known_hosts.write_text("".join(lines))
    cluster.replace_host_keys("node-02", ["ecdsa"])
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--accept-new-host-keys", "--", "true")
    first, second = doc["results"]
    assert first["ok"], first["error"]
    assert code == 2 and "HOST KEY CHANGED" in second["error"] and f"{cluster.known_hosts} line 2" in second["error"]
    assert not cluster.accepted_known_hosts.exists()


def test_revoked_keys_are_refused_even_when_also_listed_and_with_accept_new(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(2)
    key_line = cluster.host_key_line("node-01")
    _, key_type, blob = cluster.host_key_line("node-02").split()
    cluster.known_hosts.write_text(
        f"{key_line}\n@revoked {key_line}\n"  # the same key listed plain AND revoked: revoked wins
        f"@revoked * {key_type} {blob}\n"  # node-02's key revoked for every host, recorded nowhere
    )
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--accept-new-host-keys", "--", "true")
    assert code == 2
    for result, line in zip(doc["results"], (2, 3), strict=True):
        assert "@revoked" in result["error"] and f"{cluster.known_hosts} line {line}" in result["error"]
    assert not cluster.accepted_known_hosts.exists()


def test_a_host_under_a_cert_authority_is_never_accepted_on_first_use(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(1)
    ca = generate_keypair(tmp_path / "host_ca")
    node = cluster.node("node-01")
    cluster.known_hosts.write_text(f"@cert-authority {node.host},[{node.host}]:* {ca.public_line}\n")
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--accept-new-host-keys", "--", "true")
    error = doc["results"][0]["error"]
    assert code == 3 and "@cert-authority" in error and cluster.host_key_fingerprint("node-01") in error
    assert not cluster.accepted_known_hosts.exists()


def test_known_hosts_files_from_ssh_config_are_read_and_never_written(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(4)
    cluster.replace_host_keys("node-04", ["rsa"])
    files = tmp_path / "kh"
    files.mkdir()
    ed25519_of_04 = generate_keypair(tmp_path / "old_04_key").public_line  # what node-04 "had" before
    n4 = cluster.node("node-04")
    (files / "global").write_text(
        cluster.host_key_line("node-01") + f"\n{known_hosts_name(n4.host, n4.port)} {ed25519_of_04}\n"
    )
    (files / f"user_{cluster.node('node-02').host}").write_text(cluster.host_key_line("node-02") + "\n")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host *\n  UserKnownHostsFile {files}/missing {files}/user_%h\n  GlobalKnownHostsFile {files}/global\n"
    )
    cluster.known_hosts.write_text("")
    before = {p.name: p.read_text() for p in files.iterdir()}
    path = cluster.write_profile(tmp_path / "p.yaml", ssh={"config_file": str(config)})

    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--nodes", "node-01,node-02", "--", "true")
    assert code == 0, [r["error"] for r in doc["results"]]  # known only from the global / user file

    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--accept-new-host-keys", "--", "true")
    by_node = {r["node"]: r for r in doc["results"]}
    assert code == 2
    assert by_node["node-03"]["ok"], by_node["node-03"]["error"]  # unknown everywhere: recorded
    changed = by_node["node-04"]["error"]
    assert "HOST KEY CHANGED" in changed and f"{files}/global line 2" in changed
    accepted = cluster.accepted_known_hosts.read_text()
    assert cluster.host_key_line("node-03") in accepted and cluster.node("node-04").host not in accepted
    assert {p.name: p.read_text() for p in files.iterdir()} == before  # read, never written
    assert cluster.known_hosts.read_text() == ""
