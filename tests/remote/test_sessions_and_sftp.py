"""SSH error paths of one connection per node: a node whose sshd allows one session at a time
(MaxSessions 1) and a node without a working sftp subsystem, on real sshd nodes."""

from __future__ import annotations

import os
import threading
import time

import pytest

from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import SessionRefusedError, TransferError
from infer_ctl.remote.fleet import Fleet
from tests.remote.helpers import profile_of, run_json
from tests.waiting import wait_for

pytestmark = pytest.mark.ssh

ONE_SESSION = {"node-02": "MaxSessions 1"}


def _concurrently(conn, commands):
    """Run `commands` at once on one connector; each result or the error it raised, in order."""
    results: list[object] = [None] * len(commands)

    def one(i, cmd):
        try:
            results[i] = conn.run(cmd)
        except Exception as exc:  # the error is what the test looks at
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i, c)) for i, c in enumerate(commands)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_commands_on_a_one_session_node_wait_for_the_session(ssh_cluster):
    cluster = ssh_cluster(2, node_sshd_config=ONE_SESSION)
    with Fleet(profile_of(cluster)) as fleet:
        outcomes = fleet.map(
            fleet.profile.nodes,
            lambda conn, node: _concurrently(conn, [Command.sh(f"sleep 0.3; echo {i}") for i in range(3)]),
        )
    for outcome in outcomes:
        assert outcome.ok and outcome.value is not None
        assert [getattr(r, "out", r) for r in outcome.value] == ["0\n", "1\n", "2\n"], outcome.node.name


def test_a_command_refused_while_sshd_grants_another_its_session_waits_for_it(ssh_cluster):
    """The window a CI run hit: sshd has granted thread A its one session, A's open_session has not
    returned yet (so A's channel is not recorded), and thread B is refused. B must count A's slot as
    held and wait, not fail with "0 command(s) still running"."""
    cluster = ssh_cluster(1, node_sshd_config={"node-01": "MaxSessions 1"})

    def granted_slowly(conn, node):
        real_open = conn._transport.open_session
        granted = threading.Event()

        def open_session(**kwargs):
            chan = real_open(**kwargs)
            if not granted.is_set():
                granted.set()
                time.sleep(0.5)  # the slot is A's on the node; A has not recorded it yet
            return chan

        conn._transport.open_session = open_session
        results: dict[str, object] = {}
        a = threading.Thread(target=lambda: results.__setitem__("a", conn.run(Command.sh("echo a")).out))
        a.start()
        assert granted.wait(10)
        try:
            results["b"] = conn.run(Command.sh("echo b")).out
        except SessionRefusedError as exc:
            results["b"] = exc
        a.join()
        return results

    with Fleet(profile_of(cluster)) as fleet:
        (outcome,) = fleet.map(fleet.profile.nodes, granted_slowly)
    assert outcome.ok, outcome
    assert outcome.value == {"a": "a\n", "b": "b\n"}


def test_a_session_held_too_long_is_a_clear_error_for_that_node_and_others_proceed(ssh_cluster):
    cluster = ssh_cluster(2, node_sshd_config=ONE_SESSION)

    def long_then_short(conn, node):
        long = threading.Thread(target=conn.run, args=(Command("sleep", "3"),))
        long.start()
        try:
            # the long command holds the session (a fixed 0.5 s could pass before its channel was open
            # on a loaded machine: the short command then took the session and was not refused)
            assert wait_for(lambda: conn._channels, 10)
            started = time.monotonic()
            try:
                return conn.run(Command("echo", "short")).out, time.monotonic() - started
            except SessionRefusedError as exc:
                return exc, time.monotonic() - started
        finally:
            long.join()

    with Fleet(profile_of(cluster, ssh={"connect_timeout_s": 1.0})) as fleet:
        outcomes = fleet.map(fleet.profile.nodes, long_then_short)
    (ok, _), (refused, waited) = (o.value for o in outcomes)  # type: ignore[misc]
    assert ok == "short\n"
    assert isinstance(refused, SessionRefusedError), refused
    assert refused.message.startswith("node-02: sshd refused another session channel")
    assert "MaxSessions" in (refused.remedy or "") and refused.exit_code == 3
    assert 0.9 <= waited < 2.5  # it waited connect_timeout_s for the session, then said why


def test_the_idle_sftp_channel_is_given_back_to_commands(ssh_cluster):
    cluster = ssh_cluster(1, node_sshd_config={"node-01": "MaxSessions 1"})
    target = cluster.root / "node-01" / "f.conf"
    with Fleet(profile_of(cluster)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        conn.put_file(str(target), b"one\n")
        assert conn.run(Command("cat", str(target))).out == "one\n"
        assert conn.get_file(str(target)) == b"one\n"
        conn.put_file(str(target), b"two\n", mode=0o600, owner=f"{os.getuid()}:{os.getgid()}")
        assert conn.run(Command("cat", str(target))).out == "two\n"
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in target.parent.iterdir() if ".tmp" in p.name] == []


def test_exec_and_nodes_work_on_a_one_session_node(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(2, node_sshd_config=ONE_SESSION)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "echo hi")
    assert code == 0 and [r["stdout"] for r in doc["results"]] == ["hi\n", "hi\n"]
    code, doc = run_json(capsys, "nodes", "-p", str(path), "--json")
    assert code == 0 and all(r["reachable"] for r in doc["results"])


@pytest.mark.parametrize("subsystem", [None, "/bin/false"], ids=["no-subsystem", "server-fails-to-start"])
def test_without_a_working_sftp_subsystem_files_go_over_the_shell(ssh_cluster, subsystem):
    cluster = ssh_cluster(1, sftp_subsystem=subsystem)
    node_dir = cluster.root / "node-01"
    target = node_dir / "unit.conf"
    target.write_bytes(b"old\n")
    payload = bytes(range(256)) * 40 + b"\n"  # every byte value: the shell path must be byte exact
    with Fleet(profile_of(cluster)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        conn.put_file(str(target), payload, mode=0o640)
        assert conn.get_file(str(target)) == payload
        conn.put_file(str(target), b"owned\n", mode=0o600, owner=f"{os.getuid()}:{os.getgid()}")
        with pytest.raises(TransferError, match="cannot write"):
            conn.put_file(str(node_dir / "no" / "dir" / "f"), b"x")
        with pytest.raises(TransferError, match="does not exist"):
            conn.get_file(str(node_dir / "missing"))
        with pytest.raises(TransferError, match="is a directory"):
            conn.get_file(str(node_dir))
    assert target.read_bytes() == b"owned\n" and oct(target.stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in node_dir.iterdir() if ".tmp" in p.name] == []
    log = cluster.sshd_log("node-01").read_text()
    # SFTP was asked for first (once: the shell is used for the rest of the connection) and did not serve
    asked = log.count("subsystem request for sftp") + log.count("Starting session: subsystem 'sftp'")
    assert asked == 1, log
