"""sudo paths against REAL sudo (Debian's sudo package), for a throwaway account created for the test and
removed after it: `useradd` + a password + a drop-in under /etc/sudoers.d for that account only. The
system's PAM and sudo configuration are not changed. Runs only as root with sudo installed
(`apt-get install sudo`); elsewhere tests/remote/test_sudo.py covers the same paths with a stand-in."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import SudoNotAllowedError, SudoPasswordRejectedError, SudoPasswordRequiredError
from infer_ctl.remote.fleet import Fleet
from tests.remote.helpers import profile_of, run_json

pytestmark = pytest.mark.ssh

ENV = "INFERCTL_TEST_SUDO_PW"
TOOLS = ("useradd", "userdel", "chpasswd", "visudo")


@dataclass
class Account:
    name: str
    password: str
    home: Path
    sudoers: Path
    sudo_log: Path

    def allow(self, rule: str | None) -> None:
        """(Re)write the account's sudoers drop-in: `rule` is the command list, None = not in sudoers."""
        text = (
            f"Defaults:{self.name} timestamp_timeout=0, passwd_tries=3, !lecture, !mail_badpass, "
            f"logfile={self.sudo_log}\n"
        )
        if rule is not None:
            text += f"{self.name} ALL=(ALL) {rule}\n"
        tmp = self.sudoers.with_name(f".{self.sudoers.name}.new")  # names with a dot are not included
        tmp.write_text(text)
        tmp.chmod(0o440)
        subprocess.run(["visudo", "-cq", "-f", str(tmp)], check=True)
        tmp.replace(self.sudoers)


@pytest.fixture
def sudo_account() -> Iterator[Account]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a throwaway account")
    if not os.access("/usr/bin/sudo", os.X_OK) or not all(shutil.which(t) for t in TOOLS):
        pytest.skip("real sudo not installed (apt-get install sudo); tests/remote/test_sudo.py uses a stand-in")
    name = "ictl" + secrets.token_hex(4)
    home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    home.chmod(0o755)
    account = Account(name, secrets.token_urlsafe(12), home, Path("/etc/sudoers.d") / f"inferctl-test-{name}",
                      home / "sudo.log")
    created = False
    try:
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", name], check=True)
        created = True
        subprocess.run(["chpasswd"], input=f"{name}:{account.password}", text=True, check=True)
        yield account
    finally:
        account.sudoers.unlink(missing_ok=True)
        if created:
            _userdel(name)
        shutil.rmtree(f"/run/sudo/ts/{name}", ignore_errors=True)
        Path(f"/run/sudo/ts/{name}").unlink(missing_ok=True)
        shutil.rmtree(f"/var/lib/sudo/lectured/{name}", ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def _userdel(name: str) -> None:
    """userdel refuses while a process of the user lives (sshd's session process can outlast the
    client's close by a moment): retry briefly, and fail loudly rather than leave the account behind."""
    for _ in range(50):
        done = subprocess.run(["userdel", name], capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError(f"could not remove the test account {name}: {done.stderr.strip()}")


@pytest.fixture
def node(sudo_account, ssh_cluster, monkeypatch):
    """One sshd node the throwaway account logs in to (its own authorized_keys: the harness's files
    are not readable by another user). `sudo_account` comes first so it is removed after the sshd."""
    account = sudo_account
    cluster = ssh_cluster(
        1, extra_sshd_config=f"Match User {account.name}\n  AuthorizedKeysFile {account.home}/authorized_keys\n"
    )
    keys = account.home / "authorized_keys"
    shutil.copy(cluster.root / "authorized_keys", keys)
    keys.chmod(0o644)
    monkeypatch.setenv(ENV, account.password)
    return cluster, account, {"user": account.name, "sudo": True, "sudo_password_env": ENV}


def test_real_sudo_with_the_right_password_runs_as_root(node, capsys, tmp_path):
    cluster, account, ssh = node
    account.allow("ALL")
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        assert conn.run(Command("id", "-un")).out.strip() == account.name
        result = conn.run(Command.sh("id -u; cat"), sudo=True, stdin=b"rest of stdin\n")
    assert result.ok, result.err
    assert result.out == "0\nrest of stdin\n"
    path = cluster.write_profile(tmp_path / "p.yaml", ssh=ssh)
    code, doc = run_json(capsys, "nodes", "-p", str(path), "--json")
    assert code == 0 and doc["results"][0]["sudo"] == "yes", doc["results"][0]


def test_real_sudo_gets_a_wrong_password_once(node, monkeypatch):
    cluster, account, ssh = node
    account.allow("ALL")
    monkeypatch.setenv(ENV, "not-" + account.password)
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        with pytest.raises(SudoPasswordRejectedError, match="offered once"):
            conn.run(Command("id", "-u"), sudo=True)
        assert conn.run(Command("true")).ok
    # sudo logs "N incorrect password attempts" when it gives up by itself; it was stopped instead,
    # when it asked a second time, before PAM got a second answer
    log = account.sudo_log.read_text() if account.sudo_log.exists() else ""
    assert "incorrect password attempts" not in log, log


def test_real_sudo_not_in_sudoers_and_not_allowed(node):
    cluster, account, ssh = node
    account.allow(None)
    with Fleet(profile_of(cluster, ssh=ssh)) as fleet:
        conn = fleet.connector(fleet.profile.nodes[0])
        with pytest.raises(SudoNotAllowedError, match=f"{account.name} is not in the sudoers file"):
            conn.run(Command("id", "-u"), sudo=True)
        account.allow("/bin/true")
        with pytest.raises(SudoNotAllowedError, match=f"Sorry, user {account.name} is not allowed to execute"):
            conn.run(Command("id", "-u"), sudo=True)


def test_real_sudo_n_without_a_password(node):
    cluster, account, ssh = node
    account.allow("ALL")
    fleet = Fleet(profile_of(cluster, ssh={**ssh, "sudo_password_env": None}))
    with fleet, pytest.raises(SudoPasswordRequiredError, match="sudo needs a password"):
        fleet.connector(fleet.profile.nodes[0]).run(Command("id", "-u"), sudo=True)
