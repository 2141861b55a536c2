"""Host key verification against known_hosts files, with line numbers for the error messages.

Policy (never disabled by default), the same as OpenSSH's `StrictHostKeyChecking accept-new`:
- the server's key is recorded for the host (in any file read) and equal: accepted;
- the key is marked `@revoked` for the host: refused (HostKeyChangedError), whatever the policy;
- the host has recorded keys but not this one: refused as a change (HostKeyChangedError), whatever the
  policy, naming the file and line to remove. That holds for a key of ANOTHER type too: a host known
  by its ed25519 key that now offers only an RSA key may be an impostor that has no ed25519 key (OpenSSH
  9.2 says "REMOTE HOST IDENTIFICATION HAS CHANGED" for exactly this);
- no key recorded: refused (HostKeyUnknownError, with the fingerprint), unless the policy is accept-new,
  in which case it is appended to inferctl's own known_hosts file under an exclusive file lock. A host
  covered only by a `@cert-authority` line is never accepted on first use: its keys are meant to be
  vouched for by the CA, and paramiko cannot check host certificates.

Files read: `ssh.known_hosts`, the `UserKnownHostsFile`s and `GlobalKnownHostsFile`s that ~/.ssh/config
gives the host (default /etc/ssh/ssh_known_hosts{,2}, as OpenSSH), and inferctl's own file. Only
inferctl's own file is ever written.

We parse known_hosts ourselves rather than with paramiko.HostKeys because the messages need the line
numbers, and because one bad line must not make the whole file unreadable (paramiko issue #1990).
Format: sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT" (https://man.openbsd.org/sshd.8#SSH_KNOWN_HOSTS_FILE_FORMAT).
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infer_ctl.remote.errors import HostKeyChangedError, HostKeyUnknownError

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"

#: key types as known_hosts records them -> the host key algorithms that negotiate such a key. An RSA
#: key is recorded as `ssh-rsa` but negotiated as rsa-sha2-512/256 (OpenSSH >= 8.8 refuses SHA-1 ssh-rsa)
_NEGOTIATED_AS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def known_hosts_name(host: str, port: int) -> str:
    """The name a host's keys are recorded under. Lowercased as OpenSSH does before it matches or hashes
    (ssh.c lowercases the host name when it does not canonicalize it): a hashed entry (HashKnownHosts,
    ssh-keygen -H) is the HMAC of the lowercased name, so `GPU-01` must be looked up as `gpu-01`."""
    host = host.lower()
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
    #: the line vouches for a certificate authority (`@cert-authority`), not for a host key
    cert_authority: bool = False

    @property
    def plain(self) -> bool:
        """A host key recorded for the host (neither @revoked nor @cert-authority)."""
        return not self.revoked and not self.cert_authority

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

    @property
    def where(self) -> str:
        return f"{self.path} line {self.line}"


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


def parse_known_hosts_text(text: str, path: Path) -> list[KnownHostEntry]:
    """Entries of one file's text; malformed lines are skipped, not fatal."""
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker = fields[0].lower()
            if marker not in (REVOKED, CERT_AUTHORITY):
                continue  # an unknown marker: OpenSSH skips the line too
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except ValueError:
            continue
        entries.append(
            KnownHostEntry(
                path, number, fields[0], fields[1], blob, marker == REVOKED, marker == CERT_AUTHORITY
            )
        )
    return entries


def parse_known_hosts(path: Path) -> list[KnownHostEntry]:
    """Entries of one file; a missing or unreadable file has none."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return parse_known_hosts_text(text, path)


def negotiable_key_types(known_types: Sequence[str], offered: Sequence[str]) -> tuple[str, ...]:
    """`offered` (paramiko's host key algorithms) reordered so the types recorded for a host come first,
    as OpenSSH orders HostKeyAlgorithms: a host with several keys then proves the one we know instead
    of looking "changed" because it offered another type first."""
    preferred: list[str] = []
    for known in known_types:
        for algorithm in _NEGOTIATED_AS.get(known, (known,)):
            if algorithm in offered and algorithm not in preferred:
                preferred.append(algorithm)
    return tuple(preferred + [t for t in offered if t not in preferred])


class _ParsedFiles:
    """Parsed known_hosts files, re-read only when a file changes: a fleet of 1000 nodes checks its
    keys against one /etc/ssh/ssh_known_hosts that may list every host of the site."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[Path, tuple[tuple[int, int, int], list[KnownHostEntry]]] = {}

    def entries(self, path: Path) -> list[KnownHostEntry]:
        try:
            st = path.stat()
        except OSError:
            return []
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            cached = self._cache.get(path)
            if cached is not None and cached[0] == stamp:
                return cached[1]
        parsed = parse_known_hosts(path)
        with self._lock:
            self._cache[path] = (stamp, parsed)
        return parsed


class HostKeyStore:
    """The known_hosts files of one run: the user's and the system's (read-only) and inferctl's own
    (appendable). `verify` and `known_key_types` take the files ~/.ssh/config names for the host
    (`SshTarget.known_hosts_files`) on top of those."""

    def __init__(self, known_hosts: Path, accepted_file: Path, *, accept_new: bool = False) -> None:
        self.known_hosts = known_hosts
        self.accepted_file = accepted_file
        self.accept_new = accept_new
        self._lock = threading.Lock()
        self._parsed = _ParsedFiles()

    def files(self, extra: Iterable[Path | str] = ()) -> list[Path]:
        """Every file read for a host, in order, without duplicates; the accepted file last."""
        paths = [self.known_hosts, *(Path(p).expanduser() for p in extra), self.accepted_file]
        return list(dict.fromkeys(paths))

    def _matching(self, name: str, extra: Iterable[Path | str]) -> list[KnownHostEntry]:
        return [e for f in self.files(extra) for e in self._parsed.entries(f) if e.matches(name)]

    def known_key_types(self, host: str, port: int, extra: Iterable[Path | str] = ()) -> list[str]:
        """Key types recorded for the host, so the handshake can ask the server for one of them."""
        types: list[str] = []
        for e in self._matching(known_hosts_name(host, port), extra):
            if e.plain and e.key_type not in types:
                types.append(e.key_type)
        return types

    def verify(
        self, host: str, port: int, key_type: str, key_blob: bytes, extra: Iterable[Path | str] = ()
    ) -> None:
        extra = list(extra)
        name = known_hosts_name(host, port)
        fp = fingerprint(key_blob)
        entries = self._matching(name, extra)
        for e in entries:
            if e.revoked and e.key_blob == key_blob:
                raise HostKeyChangedError(
                    f"host key of {name} ({key_type} {fp}) is marked @revoked in {e.where}",
                    remedy="the key is revoked on purpose; find out why before connecting",
                )
        recorded = [e for e in entries if e.plain]
        if any(e.key_type == key_type and e.key_blob == key_blob for e in recorded):
            return
        if recorded:
            raise _changed(name, key_type, fp, recorded)
        authorities = [e for e in entries if e.cert_authority]
        if authorities:
            e = authorities[0]
            raise HostKeyUnknownError(
                f"host key of {name} ({key_type} {fp}) is to be vouched for by the @cert-authority in "
                f"{e.where}, and inferctl cannot check host certificates; it never records such a host's "
                "key on first use, not even with --accept-new-host-keys",
                fingerprint=fp,
                remedy=f"check the fingerprint {fp} on the node (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                f"then add the host's plain key to {self.known_hosts} (ssh-keyscan)",
            )
        with self._lock:  # threads of this process; the fcntl lock below covers other processes
            if self.accept_new:
                self._record(name, key_type, key_blob)
                return
        read = ", ".join(str(f) for f in self.files(extra))
        raise HostKeyUnknownError(
            f"unknown host key for {name}: {key_type} {fp} is in none of the known_hosts files read ({read})",
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
                recorded = [e for e in parse_known_hosts(self.accepted_file) if e.plain and e.matches(name)]
                if any(e.key_blob == key_blob for e in recorded):
                    return
                if recorded:
                    raise _changed(name, key_type, fingerprint(key_blob), recorded, racing=True)
                # a last line without its newline (hand-edited) would swallow the new entry and both
                # lines would be unparsable: both hosts unknown again, trusted anew on the next run
                fh.seek(0, os.SEEK_END)
                if fh.tell() and not self._ends_with_newline():
                    fh.write("\n")
                fh.write(f"{name} {key_type} {base64.b64encode(key_blob).decode()}\n")
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


    def _ends_with_newline(self) -> bool:
        with open(self.accepted_file, "rb") as raw:
            raw.seek(-1, os.SEEK_END)
            return raw.read(1) == b"\n"


def _changed(
    name: str, key_type: str, fp: str, recorded: Sequence[KnownHostEntry], *, racing: bool = False
) -> HostKeyChangedError:
    same_type = [e for e in recorded if e.key_type == key_type]
    e = (same_type or recorded)[0]
    if same_type:
        what = f"{e.where} records a different {key_type} key"
    else:
        types = ", ".join(dict.fromkeys(r.key_type for r in recorded))
        what = (
            f"{e.where} records a {e.key_type} key for it and the server offered none of the recorded "
            f"types ({types}): a key of another type is a change too"
        )
    when = " while connecting (just recorded by another inferctl)" if racing else ""
    return HostKeyChangedError(
        f"HOST KEY CHANGED for {name}{when}: the server sent {key_type} {fp}, but {what} "
        f"(possible man-in-the-middle, or the node was reinstalled)",
        remedy=f"if the change is expected, remove line {e.line} of {e.path} "
        f"(ssh-keygen -R '{name}' -f {e.path}) and connect again; inferctl never replaces a recorded key",
    )
