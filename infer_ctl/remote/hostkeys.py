"""Host key verification against known_hosts files, with line numbers for the error messages.

Policy (never disabled by default):
- a key found in a known_hosts file and equal: accepted;
- a different key of the same type recorded for the host: always refused (HostKeyChangedError), naming
  the file and line to remove, whatever the policy;
- no key recorded: refused (HostKeyUnknownError, with the fingerprint), unless the policy is accept-new,
  in which case it is appended to inferctl's own known_hosts file under an exclusive file lock.

We parse known_hosts ourselves rather than with paramiko.HostKeys because the messages need the line
numbers, and because one bad line must not make the whole file unreadable (paramiko issue #1990).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from infer_ctl.remote.errors import HostKeyChangedError, HostKeyUnknownError


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key_blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key_blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownHostEntry:
    path: Path
    line: int
    patterns: str
    key_type: str
    key_blob: bytes
    revoked: bool = False

    def matches(self, name: str) -> bool:
        matched = False
        for pattern in self.patterns.split(","):
            if pattern.startswith("|1|"):
                if _hashed_match(pattern, name):
                    matched = True
                continue
            negated = pattern.startswith("!")
            if _glob_match(pattern.lstrip("!"), name):
                if negated:
                    return False
                matched = True
        return matched


def _glob_match(pattern: str, name: str) -> bool:
    """known_hosts wildcards are only * and ?; brackets are literal (`[host]:port`), unlike fnmatch."""
    regex = re.escape(pattern).replace(r"\*", ".*").replace(r"\?", ".")
    return re.fullmatch(regex, name, flags=re.IGNORECASE) is not None


def _hashed_match(pattern: str, name: str) -> bool:
    try:
        _, _, salt_b64, hash_b64 = pattern.split("|", 3)
        salt = base64.b64decode(salt_b64)
        expected = base64.b64decode(hash_b64)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), expected)


def parse_known_hosts(path: Path) -> list[KnownHostEntry]:
    """Entries of one file; unreadable or malformed lines are skipped, not fatal."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        revoked = False
        if fields[0].startswith("@"):
            if fields[0] != "@revoked":  # @cert-authority: host certificates are not supported
                continue
            revoked = True
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        entries.append(KnownHostEntry(path, number, fields[0], fields[1], blob, revoked))
    return entries


class HostKeyStore:
    """The known_hosts files of one run: the user's (read-only) and inferctl's own (appendable)."""

    def __init__(self, known_hosts: Path, accepted_file: Path, *, accept_new: bool = False) -> None:
        self.known_hosts = known_hosts
        self.accepted_file = accepted_file
        self.accept_new = accept_new
        self._lock = threading.Lock()

    def _entries(self) -> list[KnownHostEntry]:
        files = [self.known_hosts]
        if self.accepted_file != self.known_hosts:
            files.append(self.accepted_file)
        return [e for f in files for e in parse_known_hosts(f)]

    def known_key_types(self, host: str, port: int) -> list[str]:
        """Key types recorded for the host, so the handshake can ask the server for one of them."""
        name = known_hosts_name(host, port)
        types: list[str] = []
        for e in self._entries():
            if not e.revoked and e.matches(name) and e.key_type not in types:
                types.append(e.key_type)
        return types

    def verify(self, host: str, port: int, key_type: str, key_blob: bytes) -> None:
        name = known_hosts_name(host, port)
        fp = fingerprint(key_blob)
        entries = [e for e in self._entries() if e.matches(name)]
        for e in entries:
            if e.revoked and e.key_blob == key_blob:
                raise HostKeyChangedError(
                    f"host key of {name} ({key_type} {fp}) is marked @revoked in {e.path} line {e.line}",
                    remedy="the key is revoked on purpose; find out why before connecting",
                )
        if any(not e.revoked and e.key_type == key_type and e.key_blob == key_blob for e in entries):
            return
        changed = [e for e in entries if not e.revoked and e.key_type == key_type]
        if changed:
            e = changed[0]
            raise HostKeyChangedError(
                f"HOST KEY CHANGED for {name}: the server sent {key_type} {fp}, but {e.path} line {e.line} "
                f"records a different key (possible man-in-the-middle, or the node was reinstalled)",
                remedy=f"if the change is expected, remove line {e.line} of {e.path} "
                f"(ssh-keygen -R '{name}' -f {e.path}) and connect again; inferctl never replaces a changed key",
            )
        with self._lock:  # threads of this process; the fcntl lock below covers other processes
            if self.accept_new:
                self._record(name, key_type, key_blob)
                return
        raise HostKeyUnknownError(
            f"unknown host key for {name}: {key_type} {fp} is not in {self.known_hosts}"
            + (f" or {self.accepted_file}" if self.accepted_file != self.known_hosts else ""),
            fingerprint=fp,
            remedy=f"check the fingerprint {fp} on the node (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then "
            f"rerun with --accept-new-host-keys (records it in {self.accepted_file}) or add it to "
            f"{self.known_hosts} (ssh-keyscan)",
        )

    def _record(self, name: str, key_type: str, key_blob: bytes) -> None:
        self.accepted_file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.accepted_file, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                # another inferctl may have recorded this host while we waited for the lock
                for e in parse_known_hosts(self.accepted_file):
                    if e.matches(name) and e.key_type == key_type:
                        if e.key_blob == key_blob:
                            return
                        raise HostKeyChangedError(
                            f"HOST KEY CHANGED for {name} while connecting: {self.accepted_file} line {e.line} "
                            f"was just recorded with a different key",
                            remedy=f"investigate; then remove line {e.line} of {self.accepted_file}",
                        )
                fh.write(f"{name} {key_type} {base64.b64encode(key_blob).decode()}\n")
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
