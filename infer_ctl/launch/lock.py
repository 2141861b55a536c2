"""One `launch`/`stop` at a time per node: a lock file `<lifecycle.config_dir>/launch.lock`.

Two launches racing on a node both started a server; one died on EADDRINUSE, its pid file replaced the
other's, and the survivor ran on as an orphan no pid file named. The lock makes the second run wait
(`--lock-wait`) or fail, naming the holder.

The file holds one line, `pid=... host=... boot_id=... pidns=... user=... since=... start=... cmd=...`,
describing the inferctl process on the CONTROLLER that holds it. Whether that process still lives can
only be told on its own machine, and a hostname does not name one (cloud images all boot as `ubuntu`):
the line carries the controller's `/proc/sys/kernel/random/boot_id` (one per machine and boot) and its
pid namespace (containers on one machine share the boot_id, not their pid numbers). A lock is stale only
when its boot_id, pid namespace and host are this controller's and its pid is gone (or is now another
process: its start time differs); it is then taken over, and the run says so. A lock held from any other
machine or boot is never broken automatically (`--lock-wait` waits for it); the error names its owner
and says how to remove it by hand. A line from an older inferctl without boot_id is judged as before: by
hostname and pid.

The read-compare-write of a take-over runs under flock(1) on `launch.lock.guard` where flock exists, so
two runs taking over the same stale lock cannot both win; a plain acquire is atomic by itself
(noclobber create).
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from infer_ctl.errors import InferctlError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Command, Connector
from infer_ctl.remote.fleet import Fleet

LOCK_NAME = "launch.lock"


class LockHeld(InferctlError):
    exit_code = ExitCode.FAIL


def lock_path(profile: Profile, node: Node) -> str:
    return f"{profile.sglang.lifecycle.config_dir.replace('{node}', node.name).rstrip('/')}/{LOCK_NAME}"


@dataclass(frozen=True)
class Holder:
    pid: int | None
    host: str
    user: str
    since: str
    start: str  # the process's start time in clock ticks since boot (/proc/<pid>/stat field 22)
    cmd: str
    raw: str
    #: the holder's machine and boot (/proc/sys/kernel/random/boot_id); None: not recorded (older
    #: inferctl, or a controller without /proc)
    boot_id: str | None = None
    #: the inode of the holder's pid namespace; None: not recorded
    pidns: str | None = None

    @classmethod
    def parse(cls, line: str) -> Holder:
        kv = dict(w.split("=", 1) for w in line.split() if "=" in w)
        pid = kv.get("pid", "")
        return cls(int(pid) if pid.isdigit() else None, kv.get("host", "?"), kv.get("user", "?"),
                   kv.get("since", "?"), kv.get("start", ""), kv.get("cmd", "?"), line.strip(),
                   _known(kv.get("boot_id")), _known(kv.get("pidns")))  # fmt: skip

    def describe(self) -> str:
        return f"held by pid {self.pid} ({self.user}@{self.host}, inferctl {self.cmd}) since {self.since}"

    def where(self) -> str:
        """Where the holder ran, as the error's remedy says it."""
        if self.host == socket.gethostname() and self.boot_id is not None and self.boot_id != _boot_id():
            return (f"on another machine also named {self.host}: boot_id {self.boot_id}, this controller's "
                    f"is {_boot_id() or 'unknown'}")  # fmt: skip
        if self.host == socket.gethostname() and self.pidns is not None and self.pidns != _pidns():
            return f"on {self.host} in another pid namespace (a container): pidns {self.pidns}"
        return f"on {self.host}"


def _known(value: str | None) -> str | None:
    return None if value in (None, "", "-") else value


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None  # not Linux: the lock line says "-" and no other run ever breaks it


def _pidns() -> str | None:
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return None
    return link.partition("[")[2].rstrip("]") or None


def _proc_start(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]  # field 22 overall; 20th after the command name


def me(cmd: str) -> str:
    pid = os.getpid()
    since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (f"pid={pid} host={socket.gethostname()} boot_id={_boot_id() or '-'} pidns={_pidns() or '-'} "
            f"user={getpass.getuser()} since={since} start={_proc_start(pid) or '-'} cmd={cmd}")  # fmt: skip


def _same_process_space(holder: Holder) -> bool:
    """Whether the holder's pid can be judged here: same host, and (when the line records them) same
    machine boot and pid namespace. A line with a boot_id this controller cannot match (another machine,
    another boot, or no /proc here) is never ours."""
    if holder.host != socket.gethostname():
        return False
    if holder.boot_id is None:
        return True  # an older inferctl's line: hostname only, as it was judged then
    if holder.boot_id != _boot_id():
        return False
    return holder.pidns is None or _pidns() is None or holder.pidns == _pidns()


def is_stale(holder: Holder) -> bool:
    """True only when provably dead: taken on this machine (boot, pid namespace) and that pid is gone or
    is another process."""
    if holder.pid is None or not _same_process_space(holder):
        return False
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    now = _proc_start(holder.pid)
    return bool(holder.start and holder.start != "-" and now is not None and now != holder.start)


_ACQUIRE = r"""
lock=$1; owner=$2; expect=$3
mkdir -p -- "$(dirname -- "$lock")" || exit 4
if command -v flock >/dev/null 2>&1; then exec 9>>"$lock.guard"; flock -w 10 9 || exit 5; fi
if [ -n "$expect" ]; then
  # take-over of a stale lock: only if it is still the one the caller judged stale
  cur=$(cat -- "$lock" 2>/dev/null)
  if [ -n "$cur" ] && [ "$cur" != "$expect" ]; then echo held; printf '%s\n' "$cur"; exit 0; fi
  printf '%s\n' "$owner" > "$lock.$$" && mv -f -- "$lock.$$" "$lock" && echo acquired
  exit 0
fi
if ( set -C; printf '%s\n' "$owner" > "$lock" ) 2>/dev/null; then echo acquired; exit 0; fi
echo held; cat -- "$lock" 2>/dev/null
"""

_RELEASE = r"""
lock=$1; owner=$2
if command -v flock >/dev/null 2>&1; then exec 9>>"$lock.guard"; flock -w 10 9 || exit 5; fi
[ "$(cat -- "$lock" 2>/dev/null)" = "$owner" ] && rm -f -- "$lock"
exit 0
"""


@dataclass
class Taken:
    node: str
    path: str
    #: the stale holder this run took the lock over from, if any
    took_over: Holder | None = None


def _try(conn: Connector, path: str, owner: str, expect: str, *, sudo: bool) -> Holder | None:
    """None when acquired; else who holds it."""
    res = conn.run(Command("sh", "-c", _ACQUIRE, "inferctl", path, owner, expect), sudo=sudo, timeout=30)
    words = res.out.split("\n", 1)
    if res.exit_code == 0 and words[0].strip() == "acquired":
        return None
    if res.exit_code == 0 and words[0].strip() == "held":
        return Holder.parse(words[1] if len(words) > 1 else "")
    raise LockHeld(
        f"{conn.node_name}: cannot take the launch lock {path}: {res.err.strip() or f'exit {res.exit_code}'}",
        remedy="make sglang.lifecycle.config_dir writable (ssh.sudo, or `inferctl provision --apply`)",
    )


def acquire(
    conn: Connector, path: str, owner: str, *, sudo: bool, wait_s: float = 0.0, poll_s: float = 1.0
) -> Taken:
    deadline = time.monotonic() + wait_s
    while True:
        holder = _try(conn, path, owner, "", sudo=sudo)
        if holder is None:
            return Taken(conn.node_name, path)
        if is_stale(holder):
            again = _try(conn, path, owner, holder.raw, sudo=sudo)
            if again is None:
                return Taken(conn.node_name, path, took_over=holder)
            holder = again
        if time.monotonic() >= deadline:
            waited = f" (waited {wait_s:.0f} s)" if wait_s else ""
            raise LockHeld(
                f"{conn.node_name}: another inferctl launch/stop is running here: {path} is "
                f"{holder.describe()}{waited}",
                remedy="wait for it to finish, or pass --lock-wait SECONDS; if that process is gone "
                f"(it ran {holder.where()}), remove {path} on {conn.node_name}",
            )
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def release(conn: Connector, path: str, owner: str, *, sudo: bool) -> None:
    conn.run(Command("sh", "-c", _RELEASE, "inferctl", path, owner), sudo=sudo, timeout=30)


@contextmanager
def holding(
    fleet: Fleet, profile: Profile, nodes: Sequence[Node], cmd: str, *, wait_s: float = 0.0
) -> Iterator[list[Taken]]:
    """Take the lock on every node, in profile order (two runs never hold part each and wait on the
    rest); on failure release what was taken. Yields what was taken (with any stale take-overs)."""
    owner = me(cmd)
    order = {n.name: i for i, n in enumerate(profile.nodes)}
    taken: list[tuple[Connector, Taken]] = []
    try:
        for node in sorted(nodes, key=lambda n: order[n.name]):
            conn = fleet.connector(node)
            taken.append((conn, acquire(conn, lock_path(profile, node), owner, sudo=profile.ssh.sudo,
                                        wait_s=wait_s)))  # fmt: skip
        yield [t for _, t in taken]
    finally:
        for conn, t in reversed(taken):
            try:
                release(conn, t.path, owner, sudo=profile.ssh.sudo)
            except InferctlError:
                pass  # left behind, it reads as stale (dead pid) to the next run from this host
