"""The single-process router's private directory for its admin socket, and the sweep of dead ones.

A router killed with -9 (or the OOM killer) cannot remove `$TMPDIR/inferctl-router-admin-*/admin.sock`;
each start made a new one, so they piled up. The directory holds a lock file its router keeps a shared
flock on for its whole life: the kernel drops the lock of a dead process (whatever its pid is reused
for), so the next start removes exactly the directories whose owner is gone. A directory from a router
before this lock file is removed only when its socket refuses connections (nobody listens there).
Several-process routers keep their admin socket in their own state directory (procs.py sweeps those).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile

log = logging.getLogger("infer_ctl.router")

PREFIX = "inferctl-router-admin-"
_LOCK = "owner.lock"


def make_admin_dir(tmp: str | None = None) -> tuple[str, int]:
    """A fresh 0700 directory (after sweeping dead routers' ones) and the fd holding its owner lock
    (close it, or exit, to release)."""
    sweep_stale(tmp)
    path = tempfile.mkdtemp(prefix=PREFIX, dir=tmp)
    os.chmod(path, 0o700)
    fd = os.open(os.path.join(path, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return path, fd


def sweep_stale(tmp: str | None = None) -> list[str]:
    """Remove this user's admin directories whose router is gone; returns what was removed."""
    base = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
            continue  # another user's (or not ours to judge)
        if _owner_gone(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        log.warning("removed the admin sockets of routers that were killed without a clean-up",
                    extra={"dirs": removed})
    return removed


def _owner_gone(path: str) -> bool:
    lock = os.path.join(path, _LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return _socket_dead(os.path.join(path, "admin.sock"))
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its router holds it: alive
    finally:
        os.close(fd)
    return True


def _socket_dead(sock_path: str) -> bool:
    """A directory without the lock file (an older router's, or one being created right now: mkdtemp
    then the lock, microseconds apart): dead only when a socket is there and nobody accepts on it."""
    if not os.path.exists(sock_path):
        return False
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(sock_path)
    except OSError as exc:
        return exc.errno in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        with contextlib.suppress(OSError):
            s.close()
    return False
