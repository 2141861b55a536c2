"""Which known_hosts files a node's key is checked against (ssh_config UserKnownHostsFile and
GlobalKnownHostsFile, OpenSSH's default global files), and the parsing of markers. No host needed."""

from __future__ import annotations

import base64
import getpass
import os

import paramiko
import pytest

from infer_ctl.profile import Profile
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.remote.errors import HostKeyChangedError, HostKeyUnknownError
from infer_ctl.remote.hostkeys import HostKeyStore, negotiable_key_types, parse_known_hosts_text
from infer_ctl.remote.target import DEFAULT_GLOBAL_KNOWN_HOSTS, TargetResolver, expand_path_tokens


def _profile() -> Profile:
    return validate_profile_data(
        {"name": "p", "ssh": {"config_file": None}, "nodes": [{"name": "n1", "host": "n1.lan", "roles": ["prefill", "decode"]}]}
    )


def _target(config: str):
    profile = _profile()
    return TargetResolver(profile, paramiko.SSHConfig.from_text(config)).for_node(profile.nodes[0])


def test_without_ssh_config_the_global_files_are_openssh_defaults():
    assert _target("").known_hosts_files == DEFAULT_GLOBAL_KNOWN_HOSTS == (
        "/etc/ssh/ssh_known_hosts",
        "/etc/ssh/ssh_known_hosts2",
    )


def test_user_and_global_files_from_ssh_config_with_tokens():
    target = _target(
        "Host n1.lan\n  HostName 10.1.2.3\n  User ops\n  Port 2222\n"
        '  UserKnownHostsFile ~/kh/%h "/sp ace/%n_%p_%r" ${HOME}/x %%lit\n'
        "  GlobalKnownHostsFile /site/known_hosts\n"
    )
    home = os.path.expanduser("~")
    assert target.known_hosts_files == (
        f"{home}/kh/10.1.2.3",
        "/sp ace/n1.lan_2222_ops",
        f"{os.environ.get('HOME', '')}/x",
        "%lit",
        "/site/known_hosts",
    )


def test_none_reads_no_file_of_that_kind():
    assert _target("Host *\n  GlobalKnownHostsFile none\n").known_hosts_files == ()


def test_local_tokens():
    assert expand_path_tokens("%d/%u/%i/%q", {}) == (
        f"{os.path.expanduser('~')}/{getpass.getuser()}/{os.getuid()}/%q"
    )


def test_a_global_file_passed_for_the_host_is_read(tmp_path):
    blob = b"ssh-ed25519 key one"
    site = tmp_path / "ssh_known_hosts"
    site.write_text(f"n1.lan ssh-ed25519 {base64.b64encode(blob).decode()}\n")
    store = HostKeyStore(tmp_path / "user", tmp_path / "accepted", accept_new=True)
    store.verify("n1.lan", 22, "ssh-ed25519", blob, [site])  # known from the site file only
    with pytest.raises(HostKeyChangedError, match="another type"):
        store.verify("n1.lan", 22, "ssh-rsa", b"ssh-rsa other key", [site])
    assert not (tmp_path / "accepted").exists()
    assert store.known_key_types("n1.lan", 22, [site]) == ["ssh-ed25519"]
    with pytest.raises(HostKeyUnknownError, match=str(site)):
        HostKeyStore(tmp_path / "user", tmp_path / "accepted").verify("n2.lan", 22, "ssh-ed25519", blob, [site])


def test_markers_are_parsed_and_unknown_markers_skipped(tmp_path):
    text = (
        "@revoked * ssh-ed25519 AAAA\n@cert-authority *.lan ssh-ed25519 AAAB\n@future h ssh-ed25519 AAAC\n"
        "h ssh-rsa AAAD\n"
    )
    entries = parse_known_hosts_text(text, tmp_path / "f")
    assert [(e.line, e.revoked, e.cert_authority, e.plain) for e in entries] == [
        (1, True, False, False),
        (2, False, True, False),
        (4, False, False, True),
    ]


def test_rsa_is_negotiated_as_rsa_sha2():
    offered = ("ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256")
    assert negotiable_key_types(["ssh-rsa"], offered) == (
        "rsa-sha2-512",
        "rsa-sha2-256",
        "ssh-ed25519",
        "ecdsa-sha2-nistp256",
    )
    assert negotiable_key_types(["ecdsa-sha2-nistp256"], offered)[0] == "ecdsa-sha2-nistp256"
