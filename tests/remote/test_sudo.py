"""sudo on real sshd nodes, through a stand-in that behaves like sudo 1.9 (tests/remote/standin_sudo.py):
the password from ssh.sudo_password_env is offered once, sudo's refusals become the documented errors,
and a root login needs no sudo at all."""

from __future__ import annotations

import pytest

from infer_ctl.remote.base import Command, CommandResult
from infer_ctl.remote.commandline import PASSWORD_REJECTED_LINE, SudoMode, raise_for_sudo
from infer_ctl.remote.errors import (
    SudoNotAllowedError,
    SudoPasswordRejectedError,
    SudoPasswordRequiredError,
)
from infer_ctl.remote.fleet import Fleet
from tests.remote.helpers import profile_of, run_json
from tests.remote.standin_sudo import standin_sudo

PASSWORD = "s3cret pw"
ENV = "INFERCTL_TEST_SUDO_PW"


def _node_with_sudo(ssh_cluster, monkeypatch, password: str | None, **standin):
    cluster = ssh_cluster(1)
    cluster.pose_as_unprivileged("node-01")
    cluster.add_executable("node-01", "sudo", standin_sudo(PASSWORD, **standin))
    ssh: dict[str, object] = {"sudo": True}
    if password is not None:
        monkeypatch.setenv(ENV, password)
        ssh["sudo_password_env"] = ENV
    return cluster, ssh


def _attempts(cluster) -> list[str]:
    path = cluster.bin_dir("node-01") / "sudo.attempts"
    return path.read_text().split() if path.exists() else []


@pytest.mark.ssh
def test_a_wrong_password_is_offered_once_and_is_a_clear_error(ssh_cluster, monkeypatch):
    cluster, ssh = _node_with_sudo(ssh_cluster, monkeypatch, "wrong")
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        with pytest.raises(SudoPasswordRejectedError) as info:
            conn.run(Command("id", "-u"), sudo=True)
        assert conn.run(Command("true")).ok  # the connection is fine after it
    assert _attempts(cluster) == ["wrong"], "the password must reach sudo once, never a second time"
    assert "rejected the password" in info.value.message and "offered once" in info.value.message
    assert info.value.exit_code == 2
    assert not (cluster.bin_dir("node-01") / "sudo.log").exists()  # nothing ran


@pytest.mark.ssh
def test_exec_reports_the_rejected_password_not_exit_1(ssh_cluster, monkeypatch, capsys, tmp_path):
    cluster, ssh = _node_with_sudo(ssh_cluster, monkeypatch, "wrong")
    path = cluster.write_profile(tmp_path / "p.yaml", ssh=ssh)
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--sudo", "--", "id", "-u")
    result = doc["results"][0]
    assert code == 2 and result["exit_code"] is None
    assert "sudo rejected the password" in (result["error"] or ""), result
    assert "ssh.sudo_password_env" in (result["error"] or "") and result["remedy"]
    assert _attempts(cluster) == ["wrong"]


@pytest.mark.ssh
def test_the_right_password_runs_the_command_as_root_with_the_rest_of_stdin(ssh_cluster, monkeypatch):
    cluster, ssh = _node_with_sudo(ssh_cluster, monkeypatch, PASSWORD)
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        assert conn.run(Command("id", "-u")).out.strip() == "1000"  # the posed login user
        result = conn.run(Command.sh("id -u; cat"), sudo=True, stdin=b"data\n")
    assert result.ok, result.err
    assert result.out == "0\ndata\n"
    assert _attempts(cluster) == ["ok"]


@pytest.mark.ssh
def test_not_in_the_sudoers_file_is_the_documented_error(ssh_cluster, monkeypatch, capsys, tmp_path):
    cluster, ssh = _node_with_sudo(ssh_cluster, monkeypatch, PASSWORD, sudoers="none")
    path = cluster.write_profile(tmp_path / "p.yaml", ssh=ssh)
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--sudo", "--", "id", "-u")
    result = doc["results"][0]
    assert code == 2
    assert result["error"] == "node-01: the SSH user may not use sudo: ops is not in the sudoers file."
    assert "sudoers rule" in result["remedy"]


@pytest.mark.ssh
def test_nopasswd_rules_never_ask_for_the_password(ssh_cluster, monkeypatch):
    cluster, ssh = _node_with_sudo(ssh_cluster, monkeypatch, "not needed", sudoers="nopasswd")
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        result = fleet.connector(fleet.profile.nodes[0]).run(Command("id", "-u"), sudo=True)
    assert result.out.strip() == "0" and _attempts(cluster) == []


@pytest.mark.ssh
def test_without_a_password_sudo_n_needs_one(ssh_cluster, monkeypatch):
    cluster, ssh = _node_with_sudo(ssh_cluster, monkeypatch, None)
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        with pytest.raises(SudoPasswordRequiredError, match="sudo needs a password") as info:
            conn.run(Command("id", "-u"), sudo=True)
    assert not isinstance(info.value, SudoPasswordRejectedError) and _attempts(cluster) == []


@pytest.mark.ssh
def test_a_root_login_runs_privileged_commands_itself_and_nodes_says_root(
    ssh_cluster, capsys, tmp_path, monkeypatch
):
    """Root needs no sudo: a node without a usable sudo (here one that refuses everything) still runs
    privileged commands for a root login, and `nodes` reports "root", not "sudo: no"."""
    cluster = ssh_cluster(1)
    if not cluster.is_root:
        pytest.skip("needs the tests to run as root (the harness logs in as the test's user)")
    cluster.add_executable("node-01", "sudo", 'echo "sudo: a password is required" >&2\nexit 1\n')
    path = cluster.write_profile(tmp_path / "p.yaml", ssh={"sudo": True})
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--sudo", "--", "id", "-u")
    assert code == 0 and doc["results"][0]["stdout"] == "0\n", doc["results"][0]
    code, doc = run_json(capsys, "nodes", "-p", str(path), "--json")
    assert code == 0 and doc["results"][0]["sudo"] == "root"
    monkeypatch.setenv(ENV, "unused")
    with Fleet(profile_of(cluster, ssh={"sudo": True, "sudo_password_env": ENV})) as fleet:
        result = fleet.connector(fleet.profile.nodes[0]).run(Command("cat"), sudo=True, stdin=b"in\n")
    assert result.out == "in\n"  # the password line is consumed, not passed on, for root too


def _result(err: str, code: int = 1) -> CommandResult:
    return CommandResult(code, b"", err.encode(), 0.1)


@pytest.mark.parametrize(
    ("stderr", "error"),
    [
        ("Sorry, try again.\nsudo: 3 incorrect password attempts\n", SudoPasswordRejectedError),
        (f"Sorry, try again.\n{PASSWORD_REJECTED_LINE}\n", SudoPasswordRejectedError),
        ("sudo: 1 incorrect password attempt\n", SudoPasswordRejectedError),
        ("alice is not in the sudoers file.\n", SudoNotAllowedError),
        ("alice is not in the sudoers file.  This incident will be reported.\n", SudoNotAllowedError),
        ("sudo: alice is not in the sudoers file.\n", SudoNotAllowedError),
        ("Sorry, user alice is not allowed to execute '/usr/bin/id -u' as root on vm.\n", SudoNotAllowedError),
        ("sudo: a password is required\n", SudoPasswordRequiredError),
        ("sudo: no password was provided\n", SudoPasswordRequiredError),
        ("grep: pattern not found, Sorry, try again. later\n", None),  # the command's own stderr
        ("sudo: unable to resolve host vm: Name or service not known\n", None),  # then the command's exit 1
        ("", None),
    ],
)
def test_sudo_1_9_messages_are_classified(stderr, error):
    mode = SudoMode(enabled=True, password="x")
    if error is None:
        raise_for_sudo("n1", _result(stderr), mode)
        return
    with pytest.raises(error) as info:
        raise_for_sudo("n1", _result(stderr), mode)
    assert type(info.value) is error
