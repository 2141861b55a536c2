"""The SSH connector against real sshd nodes: commands, timeouts, output, files, sudo, errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import (
    AuthError,
    ConnectionRefusedRemoteError,
    DnsError,
    SudoPasswordRequiredError,
    TransferError,
    UnreachableError,
)
from infer_ctl.remote.fleet import Fleet
from tests.remote.helpers import profile_of
from tests.waiting import wait_for

pytestmark = pytest.mark.ssh

# A stand-in for sudo where the SSH user has no passwordless sudo: behaves like `sudo -n` refusing.
STANDIN_SUDO_REFUSES = 'echo "sudo: a password is required" >&2\nexit 1\n'
# A stand-in for sudo that is allowed: skips its options and runs the command (we are root already),
# with SUDO_UID set as sudo sets it.
STANDIN_SUDO_ALLOWS = (
    'while [ "$1" != "--" ]; do shift; done; shift\necho "$*" >> "$(dirname "$0")/sudo.log"\n'
    'SUDO_UID=1000; export SUDO_UID\nexec "$@"\n'
)


@pytest.fixture
def one(ssh_cluster):
    cluster = ssh_cluster(1)
    fleet = Fleet(profile_of(cluster))
    yield cluster, fleet, fleet.connector(fleet.profile.nodes[0])
    fleet.close()


def test_run_returns_exit_code_stdout_stderr_and_passes_env_and_stdin(one):
    _, _, conn = one
    result = conn.run(
        Command.sh('echo "$GREETING"; cat; echo oops >&2; exit 7'),
        env={"GREETING": "it's $x"},
        stdin=b"from stdin\n",
    )
    assert result.exit_code == 7 and not result.ok and not result.timed_out
    assert result.stdout == b"it's $x\nfrom stdin\n"
    assert result.stderr == b"oops\n"


def test_arguments_are_quoted_not_interpreted_by_the_remote_shell(one):
    _, _, conn = one
    result = conn.run(Command("printf", "%s|", "a b", "$HOME", "; touch /tmp/never", "'q'"))
    assert result.out == "a b|$HOME|; touch /tmp/never|'q'|"


def test_timeout_stops_the_command_and_kills_its_remote_process(one):
    _, _, conn = one
    started = time.monotonic()
    result = conn.run(Command.sh("sleep 31.4159 & wait"), timeout=0.5)
    assert result.timed_out and not result.ok
    assert time.monotonic() - started < 5
    # GNU timeout TERMs the group; the sleep exits a moment after the shell (a fixed 0.3 s before one look)
    left = wait_for(lambda: not conn.run(Command.sh("pgrep -f 'sleep 31[.]4159' || true")).out.strip(), 5)
    assert left, "the remote sleep outlived its timeout"


def test_large_stdout_and_stderr_at_once_arrive_complete(one):
    _, _, conn = one
    script = "head -c 3000000 /dev/zero | tr '\\0' e >&2 & head -c 8000000 /dev/zero | tr '\\0' o; wait"
    result = conn.run(Command.sh(script), timeout=60)
    assert result.ok
    assert len(result.stdout) == 8_000_000 and set(result.stdout) == {ord("o")}
    assert len(result.stderr) == 3_000_000


def test_non_utf8_output_is_kept_byte_exact(one):
    _, _, conn = one
    result = conn.run(Command("printf", "\\377\\376ok\\n"))
    assert result.stdout == b"\xff\xfeok\n"
    assert result.out == "\ufffd\ufffdok\n"


def test_put_file_replaces_atomically_with_mode_and_leaves_no_temp_files(one, tmp_path):
    cluster, _, conn = one
    target = cluster.root / "node-01" / "unit.conf"
    target.write_bytes(b"old contents\n")
    with open(target, "rb") as reader:  # a reader of the old file keeps seeing it whole
        conn.put_file(str(target), b"new contents\n" * 1000, mode=0o640)
        assert reader.read() == b"old contents\n"
    assert target.read_bytes() == b"new contents\n" * 1000
    assert oct(target.stat().st_mode & 0o777) == "0o640"
    assert sorted(p.name for p in target.parent.iterdir() if "inferctl" in p.name) == []
    assert conn.get_file(str(target)) == b"new contents\n" * 1000


def test_put_file_into_missing_directory_is_a_transfer_error(one):
    cluster, _, conn = one
    with pytest.raises(TransferError, match="cannot write"):
        conn.put_file(str(cluster.root / "no" / "such" / "dir" / "f"), b"x")
    with pytest.raises(TransferError, match="does not exist"):
        conn.get_file(str(cluster.root / "missing"))


def test_sudo_refusal_is_reported_with_the_remedy(ssh_cluster):
    cluster = ssh_cluster(1)
    cluster.pose_as_unprivileged("node-01")  # a root login would need no sudo
    cluster.add_executable("node-01", "sudo", STANDIN_SUDO_REFUSES)
    with Fleet(profile_of(cluster, ssh={"sudo": True})) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        with pytest.raises(SudoPasswordRequiredError, match="sudo needs a password") as info:
            conn.run(Command("id", "-u"), sudo=True)
        assert "NOPASSWD" in (info.value.remedy or "")
        assert conn.run(Command("id", "-u")).ok  # without sudo the node is fine


def test_sudo_put_file_goes_through_sudo_and_is_atomic(ssh_cluster):
    cluster = ssh_cluster(1)
    cluster.pose_as_unprivileged("node-01")  # a root login would need no sudo
    cluster.add_executable("node-01", "sudo", STANDIN_SUDO_ALLOWS)
    target = cluster.root / "node-01" / "etc-file"
    with Fleet(profile_of(cluster, ssh={"sudo": True})) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        conn.put_file(str(target), b"root-owned\n", mode=0o600, owner="0:0", sudo=True)
    assert target.read_bytes() == b"root-owned\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert "sh -c" in (cluster.bin_dir("node-01") / "sudo.log").read_text()
    assert [p.name for p in target.parent.iterdir() if ".tmp" in p.name] == []


def test_wrong_key_is_an_auth_error_naming_the_key_tried(ssh_cluster, tmp_path):
    from tests.sshd_harness import generate_keypair

    cluster = ssh_cluster(1)
    wrong = generate_keypair(tmp_path / "wrong_key")
    fleet = Fleet(profile_of(cluster, ssh={"identity_file": str(wrong.private_path)}))
    with fleet, pytest.raises(AuthError) as info:
        fleet.connector(fleet.profile.nodes[0])
    assert str(wrong.private_path) in info.value.message
    assert "authorized_keys" in (info.value.remedy or "")
    assert info.value.exit_code == 3


def test_an_encrypted_key_is_reported_as_such_not_as_a_crash(ssh_cluster, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    cluster = ssh_cluster(1)
    key = tmp_path / "encrypted_key"
    key.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    with Fleet(profile_of(cluster, ssh={"identity_file": str(key), "use_agent": False})) as fleet:
        outcome = fleet.map(fleet.profile.nodes, lambda conn, node: conn.run(Command("true")))[0]
    assert isinstance(outcome.error, AuthError), outcome.error
    assert f"{key}: encrypted" in outcome.error.message and "ssh-add" in (outcome.error.remedy or "")


def test_a_silent_server_gives_one_plain_line_and_no_traceback(ssh_cluster, tmp_path):
    """Run as a real process: paramiko's transport thread logs a traceback that, without a handler,
    Python would print on the user's stderr next to our own one-line error."""
    cluster = ssh_cluster(1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    data = cluster.profile_data(ssh={"connect_timeout_s": 0.5})
    data["nodes"][0].update(host="127.0.0.1", port=silent.getsockname()[1])
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "infer_ctl", "exec", "-p", str(path), "--json", "--", "true"],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        silent.close()
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    result = json.loads(proc.stdout)["results"][0]
    assert "sent no SSH greeting within 0.5s" in result["error"] and "sshd" in result["remedy"]


def test_refused_dns_and_silent_servers_are_unreachable_with_plain_reasons(ssh_cluster):
    cluster = ssh_cluster(2)
    cluster.stop("node-02")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts TCP (backlog) but never speaks SSH
    data = cluster.profile_data(ssh={"connect_timeout_s": 0.5})
    data["nodes"][0].update(host="no-such-host.invalid")
    data["nodes"].append(
        {"name": "silent", "host": "127.0.0.1", "port": silent.getsockname()[1], "roles": ["decode"]}
    )
    from infer_ctl.profile.load import validate_profile_data

    profile = validate_profile_data(data)
    try:
        with Fleet(profile) as fleet:
            outcomes = fleet.map(profile.nodes, lambda conn, node: conn.run(Command("true")))
    finally:
        silent.close()
    dns, refused, mute = (o.error for o in outcomes)
    assert isinstance(dns, DnsError) and "cannot resolve" in dns.message
    assert isinstance(refused, ConnectionRefusedRemoteError) and "refused" in refused.message
    assert isinstance(mute, UnreachableError) and "no SSH greeting" in mute.message
    assert all(o.duration_s < 5 for o in outcomes)


def test_one_connection_per_node_is_reused_for_many_commands(ssh_cluster):
    cluster = ssh_cluster(1)
    with Fleet(profile_of(cluster)) as fleet:
        node = fleet.profile.nodes[0]
        threads = [
            threading.Thread(target=lambda: fleet.connector(node).run(Command("true"))) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for _ in range(3):
            fleet.map([node], lambda conn, n: conn.run(Command("true")))
    log = cluster.sshd_log("node-01").read_text()
    assert log.count("Accepted publickey") == 1


def test_environment_names_are_validated(one):
    from infer_ctl.errors import UsageError

    _, _, conn = one
    with pytest.raises(UsageError):
        conn.run(Command("true"), env={"BAD NAME; rm -rf /": "x"})

