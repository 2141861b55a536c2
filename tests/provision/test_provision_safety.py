"""Provisioning's own safety: numeric options refused before anything is planned, leftovers of an
interrupted write cleaned, backups bounded, writes over the exec channel where the node serves no SFTP,
and a root login needing no sudo.

Real: sshd nodes with private /etc, /opt, /var (conftest.py), the shell commands provision runs there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.remote.base import Command
from tests.provision.test_provision_e2e import entries, on_node, run_cli

SYSCTL = "/etc/sysctl.d/90-inferctl.conf"


@pytest.mark.parametrize(("argv", "message"), [
    (["--hugepages", "-7"], "--hugepages must be at least 0, got -7"),
    (["--keep-backups", "0"], "--keep-backups must be at least 1, got 0"),
    (["--parallel", "0"], "--parallel must be at least 1, got 0"),
    (["--rolling", "-1", "--apply", "--yes"], "--rolling must be at least 1, got -1"),
])  # fmt: skip
def test_every_numeric_option_is_checked_before_planning(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "p.yaml"
    # no node is reachable: a refusal comes before any connection
    profile.write_text("name: p\nnodes:\n  - {name: n1, host: 192.0.2.1, roles: [prefill, decode]}\n"
                       "ssh: {connect_timeout_s: 1}\nsglang: {collocated: {port: 30000}}\ncollocated: true\n")  # fmt: skip
    assert main(["provision", "-p", str(profile), *argv]) == 64
    assert message in capsys.readouterr().err
    assert main(["provision", "rollback", "-p", str(profile), "--parallel", "0"]) == 64


def _age(profile: Path, *paths: str) -> None:
    assert on_node(profile, Command("touch", "-d", "1 hour ago", "--", *paths)).ok


@pytest.mark.ssh
def test_leftover_temp_files_of_an_interrupted_write_are_removed(prov_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile()
    code, _ = run_cli(capsys, "provision", "--apply", "--yes", "--only", "sysctl", "-p", str(profile))
    assert code == 0
    # what a killed SFTP put and a killed shell put leave, and one of a write in progress right now
    old = ["/etc/sysctl.d/.90-inferctl.conf.inferctl-0123456789ab.tmp", "/etc/sysctl.d/.90-inferctl.conf.inferctl.4242.tmp"]
    fresh = "/etc/sysctl.d/.90-inferctl.conf.inferctl-fedcba987654.tmp"
    assert on_node(profile, Command("touch", "--", *old, fresh)).ok
    _age(profile, *old)
    code, doc = run_cli(capsys, "provision", "--only", "sysctl", "-p", str(profile))
    assert code == 1
    [entry] = [e for e in entries(doc) if e["subject"] == SYSCTL]
    assert entry["kind"] == "change"
    assert entry["summary"] == ("remove 2 leftover temp file(s) of an interrupted write: "
                                ".90-inferctl.conf.inferctl-0123456789ab.tmp, .90-inferctl.conf.inferctl.4242.tmp")
    code, _ = run_cli(capsys, "provision", "--apply", "--yes", "--only", "sysctl", "-p", str(profile))
    assert code == 0
    assert [p.exists() for p in (pc.node_path(node, old[0]), pc.node_path(node, old[1]))] == [False, False]
    assert pc.node_path(node, fresh).exists()  # younger than 10 minutes: maybe another run's write
    code, _ = run_cli(capsys, "provision", "--only", "sysctl", "-p", str(profile))
    assert code == 0


@pytest.mark.ssh
def test_backups_are_kept_for_the_last_n_writes_only(prov_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile()
    target = pc.node_path(node, SYSCTL)
    for i in range(4):
        if i:  # drift: someone edits the file; every apply backs the edit up
            assert on_node(profile, Command("sh", "-c", f"echo '# edit {i}' >> {SYSCTL}")).ok
        code, _ = run_cli(capsys, "provision", "--apply", "--yes", "--only", "sysctl", "--keep-backups", "2", "-p", str(profile))
        assert code == 0
    backups = sorted(target.parent.glob("90-inferctl.conf.inferctl-backup-*"))
    assert [b.read_text().splitlines()[-1] for b in backups] == ["# edit 2", "# edit 3"]


@pytest.mark.ssh
def test_root_without_sftp_and_without_sudo_writes_over_the_exec_channel(
    prov_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sudo: true` on a root login whose node has no sudo, and no sftp subsystem: root needs no sudo,
    and files go over the shell."""
    pc = prov_cluster(1, sftp_subsystem=None)
    node = pc.cluster.names[0]
    pc.cluster.add_executable(node, "sudo", 'echo "sudo $*" >> "$(dirname "$0")/../state/sudo.log"; echo "sh: sudo: not found" >&2; exit 127\n')
    for sudo in (True, False):
        profile = pc.profile(pc.tmp / f"sudo-{sudo}.yaml", ssh={"sudo": sudo})
        code, doc = run_cli(capsys, "provision", "--apply", "--yes", "--only", "sysctl,memlock,user,logrotate,units",
                            "-p", str(profile))  # fmt: skip
        assert code == 0, [e for e in entries(doc) if e["kind"] not in ("ok", "skip")]
        code, _ = run_cli(capsys, "provision", "-p", str(profile), "--only", "sysctl,memlock,user,logrotate,units")
        assert code == 0
    assert "vm.max_map_count = 16777216" in pc.node_path(node, SYSCTL).read_text()
    assert not (pc.node_dir(node) / "state" / "sudo.log").exists(), "root ran sudo"
