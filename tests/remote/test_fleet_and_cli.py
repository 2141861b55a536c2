"""Fan-out (fail-fast, errors, cancellation) and the `nodes` / `exec` commands over real sshd."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import pytest

from infer_ctl.errors import UsageError
from infer_ctl.profile.select import select_nodes
from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import NodeSkippedError, UnexpectedNodeError
from infer_ctl.remote.fleet import Fleet
from infer_ctl.remote.outcomes import command_failed
from tests.remote.helpers import profile_of, run_cli, run_json

pytestmark = pytest.mark.ssh

EXEC_KEYS = {"node", "host", "ok", "exit_code", "stdout", "stderr", "duration_s", "error", "remedy"}


def test_exec_on_many_nodes_json_shape_and_exit_0(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(8)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(
        capsys, "exec", "-p", str(path), "--json", "--parallel", "4", "--", "echo $INFERCTL_TEST_NODE"
    )
    assert code == 0 and doc["exit_code"] == 0 and doc["command"] == "exec"
    assert [r["stdout"] for r in doc["results"]] == [f"{n.name}\n" for n in cluster.nodes]
    assert all(set(r) == EXEC_KEYS and r["ok"] and r["error"] is None for r in doc["results"])


def test_exec_exit_codes_unreachable_3_failed_2(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(3)
    path = cluster.write_profile(tmp_path / "p.yaml")
    cluster.stop("node-02")
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "true")
    assert code == 3 and [r["ok"] for r in doc["results"]] == [True, False, True]
    assert "refused" in doc["results"][1]["error"] and doc["results"][1]["exit_code"] is None
    code, doc = run_json(
        capsys, "exec", "-p", str(path), "--json", "--", "test $INFERCTL_TEST_NODE != node-03"
    )
    assert code == 2 and doc["results"][2]["exit_code"] == 1


def test_exec_table_output_timeout_and_non_utf8(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(2)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, out, _ = run_cli(capsys, "exec", "-p", str(path), "--", "printf", "\\377line1\\nline2\\n")
    assert code == 0 and "line1" in out and "node-02" in out and "2/2 ok" in out
    code, doc = run_json(
        capsys, "exec", "-p", str(path), "--json", "--timeout", "0.5", "--nodes", "node-01", "--", "sleep 20"
    )
    timed_out = doc["results"][0]
    assert code == 2 and "timed out after 0.5s" in timed_out["error"]
    # the command never chose an exit code: null (docs/remote.md), not timeout(1)'s 124
    assert timed_out["exit_code"] is None and "--timeout" in timed_out["remedy"]
    code, out, _ = run_cli(capsys, "exec", "-p", str(path), "--timeout", "0.5", "--nodes", "node-01", "--", "sleep 20")
    assert code == 2 and "timed out" in out and "raise --timeout" in out


def test_exec_sudo_refused_is_a_failure(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(1)
    cluster.pose_as_unprivileged("node-01")  # a root login would need no sudo
    cluster.add_executable("node-01", "sudo", 'echo "sudo: a password is required" >&2\nexit 1\n')
    path = cluster.write_profile(tmp_path / "p.yaml", ssh={"sudo": True})
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--sudo", "--", "id -u")
    assert code == 2 and "sudo needs a password" in doc["results"][0]["error"]


def test_exec_usage_errors_exit_64(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(1)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, _, err = run_cli(capsys, "exec", "-p", str(path), "--nodes", "dc-*", "--", "true")
    assert code == 64 and "matches no node" in err and "node-01" in err
    code, _, err = run_cli(capsys, "exec", "-p", str(path), "--role", "prefil", "--", "true")
    assert code == 64 and "prefill" in err


def test_nodes_command_reports_facts_and_unreachable(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(2)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, doc = run_json(capsys, "nodes", "-p", str(path), "--json")
    assert code == 0
    first = doc["results"][0]
    assert first["reachable"] and first["kernel"] and first["user"] == cluster.user and first["uptime_s"] > 0
    assert first["sudo"] in ("root", "not used (ssh.sudo: false)")
    cluster.stop("node-01")
    code, doc = run_json(capsys, "nodes", "-p", str(path), "--json")
    assert code == 3 and not doc["results"][0]["reachable"] and "refused" in doc["results"][0]["error"]
    code, out, _ = run_cli(capsys, "nodes", "-p", str(path))
    assert code == 3 and "1/2 reachable" in out and "sshd running" in out


def test_nodes_names_the_node_in_host_key_errors_and_exec_shows_the_remedy(ssh_cluster, capsys, tmp_path):
    cluster = ssh_cluster(2)
    cluster.regenerate_host_key("node-02")  # the host key error names the host, not the node
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, out, _ = run_cli(capsys, "nodes", "-p", str(path))
    flat = " ".join(out.split())
    assert code == 2 and "node-02: HOST KEY CHANGED" in flat and "ssh-keygen -R" in flat
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "true")
    bad = doc["results"][1]
    assert code == 2 and "HOST KEY CHANGED" in bad["error"] and "ssh-keygen -R" in bad["remedy"]
    assert doc["results"][0]["remedy"] is None


def test_fail_fast_skips_nodes_not_yet_started(ssh_cluster):
    cluster = ssh_cluster(4)
    profile = profile_of(cluster, ssh={"parallelism": 1})
    with Fleet(profile) as fleet:
        outcomes = fleet.map(
            profile.nodes,
            lambda conn, node: conn.run(Command("false")),
            fail_fast=True,
            failed=command_failed,
        )
    assert outcomes[0].value is not None and outcomes[0].value.exit_code == 1
    assert all(isinstance(o.error, NodeSkippedError) for o in outcomes[1:])
    assert "node-01" in outcomes[1].error.message


def test_unexpected_exceptions_become_node_errors(ssh_cluster):
    cluster = ssh_cluster(2)
    profile = profile_of(cluster)

    def boom(conn, node):
        if node.name == "node-02":
            raise KeyError("gpu7")
        return 1

    with Fleet(profile) as fleet:
        outcomes = fleet.map(profile.nodes, boom)
    assert outcomes[0].ok and outcomes[0].value == 1
    assert isinstance(outcomes[1].error, UnexpectedNodeError) and "KeyError" in outcomes[1].error.message


def _remote_pids(profile, pattern: str) -> list[str]:
    with Fleet(profile) as check:
        result = check.connector(profile.nodes[0]).run(Command.sh(f"pgrep -f '{pattern}' || true"))
    return result.out.split()


def _wait_gone(profile, pattern: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _remote_pids(profile, pattern):
            return True
        time.sleep(0.2)
    return False


def test_abort_kills_this_runs_remote_commands_over_root_logins_and_nothing_else(ssh_cluster):
    # Ctrl-C path. OpenSSH refuses the SSH "signal" request for root logins, and the harness logs in
    # as root when the tests run as root: the commands' 60 s remote timeout must not be what ends
    # them. Another run's command on the same node, and a process inferctl did not start, survive.
    cluster = ssh_cluster(2)
    profile = profile_of(cluster)
    fleet, other = Fleet(profile), Fleet(profile)
    result: list = []

    def in_thread(f: Fleet, script: str, into: list) -> threading.Thread:
        thread = threading.Thread(
            target=lambda: into.extend(f.map(profile.nodes, lambda c, n: c.run(Command.sh(script), timeout=60)))
        )
        thread.start()
        return thread

    bystander = subprocess.Popen(["sleep", "47.1828"])
    worker = in_thread(fleet, "sleep 27.1828 & wait", result)
    survivor = in_thread(other, "sleep 37.1828", [])
    try:
        deadline = time.monotonic() + 10
        while len(_remote_pids(profile, "^sleep [23]7[.]1828")) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        fleet.abort()
        worker.join(timeout=10)
        assert not worker.is_alive() and time.monotonic() - started < 5
        assert len(result) == 2 and all(not o.ok or not o.value.ok for o in result)
        assert _wait_gone(profile, "sleep 27[.]1828", within=3)
        assert len(_remote_pids(profile, "^sleep 37[.]1828")) == 2, "another run's commands were killed"
        assert bystander.poll() is None, "a process inferctl did not start was killed"
    finally:
        fleet.close()
        other.abort()
        other.close()
        survivor.join(timeout=10)
        bystander.kill()
        bystander.wait()
    assert _wait_gone(profile, "sleep 37[.]1828", within=3)


def test_ctrl_c_on_exec_exits_130_and_leaves_no_remote_process(ssh_cluster, tmp_path):
    # The reproduction: `inferctl exec -- 'sleep 98'` as root, SIGINT, nothing left behind.
    cluster = ssh_cluster(2)
    path = cluster.write_profile(tmp_path / "p.yaml")
    profile = profile_of(cluster)
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl", "exec", "-p", str(path), "--json", "--", "sleep 98.2718"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a suite started in the background by a non-interactive shell inherits SIGINT ignored, and so would
        # exec (Python keeps an ignored SIGINT ignored): it then ran into its command timeout, exit 2
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 20
        while len(_remote_pids(profile, "^sleep 98[.]2718")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_remote_pids(profile, "^sleep 98[.]2718")) == 2, "the remote commands never started"
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=15)  # the abort is bounded (Fleet.abort: ABORT_WAIT_S + 1 s)
        assert rc == 130, proc.communicate()  # what exec said, when it did not stop as interrupted
        assert _wait_gone(profile, "sleep 98[.]2718", within=3), "remote `sleep` outlived Ctrl-C"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_select_nodes_globs_and_roles(ssh_cluster):
    cluster = ssh_cluster(names=["pf-01", "pf-02", "dc-01", "dc-02"])
    profile = profile_of(cluster)
    assert [n.name for n in select_nodes(profile, "pf-01,dc-*")] == ["pf-01", "dc-01", "dc-02"]
    assert [n.name for n in select_nodes(profile, role="decode")] == ["dc-01", "dc-02"]
    assert [n.name for n in select_nodes(profile, "*-01", role="prefill")] == ["pf-01"]
    with pytest.raises(UsageError, match="matches no node"):
        select_nodes(profile, "xx-*")
    with pytest.raises(UsageError, match="selection matches no node"):
        select_nodes(profile, "pf-01", role="decode")
