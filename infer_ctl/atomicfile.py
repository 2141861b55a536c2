"""Atomic writes of local files: temp file in the same directory, fsync, rename. A reader (node_exporter,
a later run, systemd) never sees a half-written file. Ground floor: imports the stdlib only, so every
layer (output, remote, launch) can use it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_atomic(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    mode: int = 0o644,
    owner: str | None = None,
    make_parents: bool = True,
    exclusive: bool = False,
) -> Path:
    """`owner` is `user`, `user:group` or `:group`, applied before the rename so the file never appears
    with the wrong owner. `exclusive`: raise FileExistsError rather than replace an existing file; the
    check and the write are one step (link(2) refuses an existing name), so two writers cannot both
    think the name was free."""
    target = Path(path)
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if owner:
            user, _, group = owner.partition(":")
            if user and group:
                shutil.chown(tmp, user, group)
            elif user:
                shutil.chown(tmp, user=user)
            else:
                shutil.chown(tmp, group=group)
        if exclusive:
            os.link(tmp, target)
            os.unlink(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


class ShortWrite(OSError):
    """An append that the kernel cut short and that made no progress (disk full, quota)."""


def append_line(path: str | os.PathLike[str], line: str, *, mode: int = 0o644) -> None:
    """Append one line to a JSON-lines file (the audit history, the spec controller's actions).

    A file whose last line is torn (a crash or a full disk mid-write) gets a newline first, so the torn
    line stays one bad line that readers skip instead of swallowing this record too. O_APPEND puts each
    write() at the end; a short write (a full disk, a signal) is continued until every byte is down, and
    one that writes nothing raises, so a record is never silently half there."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    payload = (line if line.endswith("\n") else line + "\n").encode("utf-8")
    fd = os.open(target, os.O_RDWR | os.O_APPEND | os.O_CREAT, mode)
    try:
        size = os.fstat(fd).st_size
        if size > 0 and os.pread(fd, 1, size - 1) != b"\n":
            payload = b"\n" + payload
        view = memoryview(payload)
        while view:
            n = os.write(fd, view)
            if n <= 0:
                raise ShortWrite(f"{target}: wrote {len(payload) - len(view)} of {len(payload)} bytes")
            view = view[n:]
    finally:
        os.close(fd)
