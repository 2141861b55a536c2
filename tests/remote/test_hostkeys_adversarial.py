"""Host key checks against inputs an attacker or a hand-edited file provides: host names in another
case than a hashed known_hosts entry was made from (OpenSSH lowercases host names before matching and
hashing), an accepted file whose last line has no newline. No host needed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest

from infer_ctl.remote.errors import HostKeyChangedError
from infer_ctl.remote.hostkeys import HostKeyStore, parse_known_hosts

KNOWN = b"\x00\x00\x00\x0bssh-ed25519 the known key"
IMPOSTOR = b"\x00\x00\x00\x0bssh-ed25519 an impostor key"


def _hashed(name: str) -> str:
    salt = os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def _line(name: str, blob: bytes) -> str:
    return f"{name} ssh-ed25519 {base64.b64encode(blob).decode()}\n"


@pytest.mark.parametrize("port", [22, 2222])
def test_a_hashed_entry_matches_the_host_written_in_another_case(tmp_path, port):
    """ssh-keygen -H and HashKnownHosts (Debian/Ubuntu's default) hash the lowercased name: a profile
    saying GPU-01.Example.com must still find it, or accept-new records an impostor's key."""
    name = "gpu-01.example.com" if port == 22 else f"[gpu-01.example.com]:{port}"
    known = tmp_path / "known_hosts"
    known.write_text(_line(_hashed(name), KNOWN))
    store = HostKeyStore(known, tmp_path / "accepted", accept_new=True)
    store.verify("GPU-01.Example.com", port, "ssh-ed25519", KNOWN)
    with pytest.raises(HostKeyChangedError, match="HOST KEY CHANGED"):
        store.verify("GPU-01.Example.com", port, "ssh-ed25519", IMPOSTOR)
    assert not (tmp_path / "accepted").exists(), "an impostor's key was recorded"
    assert store.known_key_types("GPU-01.EXAMPLE.COM", port) == ["ssh-ed25519"]


def test_recording_after_a_last_line_without_newline_keeps_both_entries(tmp_path):
    """An accepted file edited by hand (or by `echo -n`) may end without a newline: appending must not
    glue the new entry onto it, which would make both lines unparsable and both hosts unknown again
    (the next --accept-new-host-keys run would then trust whatever key is offered)."""
    accepted = tmp_path / "accepted"
    accepted.write_text(_line("h1", KNOWN).rstrip("\n"))
    store = HostKeyStore(tmp_path / "known_hosts", accepted, accept_new=True)
    store.verify("h2", 22, "ssh-ed25519", IMPOSTOR)
    assert [(e.patterns, e.key_blob) for e in parse_known_hosts(accepted)] == [("h1", KNOWN), ("h2", IMPOSTOR)]
    with pytest.raises(HostKeyChangedError):
        store.verify("h1", 22, "ssh-ed25519", IMPOSTOR)
