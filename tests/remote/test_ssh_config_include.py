"""ssh_config `Include` (paramiko ignores it): HostName, User and UserKnownHostsFile from included files,
relative paths under ~/.ssh, globs in lexical order, conditional includes inside Host/Match blocks, the
enclosing block resuming after the include, and loops. No host needed."""

from __future__ import annotations

import pytest

from infer_ctl.errors import ProfileError
from infer_ctl.remote.target import load_ssh_config


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh" / "config.d").mkdir(parents=True)
    return tmp_path


def test_included_hostname_user_and_known_hosts_files_are_read(home):
    ssh = home / ".ssh"
    (ssh / "config.d" / "10-gpu.conf").write_text(
        "Host gpu-01\n  HostName 10.0.0.1\n  User ops\n  UserKnownHostsFile /site/fleet_known_hosts\n"
    )
    (ssh / "config.d" / "20-late.conf").write_text("Host gpu-01\n  HostName 10.9.9.9\n  Port 2222\n")
    (ssh / "config").write_text("Include config.d/*.conf\nHost *\n  User nobody\n")
    cfg = load_ssh_config(str(ssh / "config")).lookup("gpu-01")
    # first value wins, files in lexical order, and the include's lines before the main file's
    assert cfg["hostname"] == "10.0.0.1" and cfg["user"] == "ops" and cfg["port"] == "2222"
    assert cfg["userknownhostsfile"] == "/site/fleet_known_hosts"


def test_an_include_inside_a_host_block_is_conditional_and_the_block_resumes(home):
    ssh = home / ".ssh"
    (ssh / "lab.conf").write_text("User labuser\nHost *-01\n  HostName one.lab\n")
    (ssh / "config").write_text("Host lab-*\n  Include ~/.ssh/lab.conf\n  Port 2200\nHost *\n  Port 22\n")
    lab = load_ssh_config(str(ssh / "config")).lookup("lab-01")
    assert (lab["user"], lab["hostname"], lab["port"]) == ("labuser", "one.lab", "2200")
    prod = load_ssh_config(str(ssh / "config")).lookup("prod-01")
    assert "user" not in prod and prod["hostname"] == "prod-01" and prod["port"] == "22"


def test_an_include_loop_is_a_profile_error(home):
    (home / ".ssh" / "config").write_text("Include config\n")
    with pytest.raises(ProfileError, match="nested more than 16"):
        load_ssh_config(str(home / ".ssh" / "config"))
