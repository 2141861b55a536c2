"""Who listens on an instance's ports, read on its node from /proc (no `ss`/`lsof` needed).

`/proc/net/tcp{,6}` lists every listening socket with its inode; `/proc/<pid>/fd/*` links name the
socket inodes each process holds. Joining the two gives the pid, process group, session, cgroup and
command line of whatever holds a port. A process of another user is visible only with ssh.sudo (its fd
links are not readable otherwise): such a listener is reported with no holder, never assumed ours.

Used three ways: before a start (refuse to start over a foreign process), when a server first answers
(ready only if the listener is the process we started), and by `stop` when the pid file is stale.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from infer_ctl.core.sglang import Instance
from infer_ctl.remote.base import Command, Connector

# TCP_LISTEN is state 0A in /proc/net/tcp (include/net/tcp_states.h).
_LISTENERS = r"""
want=""
for p in "$@"; do want="$want $(printf '%04X' "$p")"; done
found=$(awk -v want="$want" 'BEGIN { n = split(want, a, " "); for (i = 1; i <= n; i++) w[a[i]] = 1 }
  FNR > 1 && $4 == "0A" { split($2, la, ":"); if (la[2] in w) print "L", $2, $10 }' \
  /proc/net/tcp /proc/net/tcp6 2>/dev/null)
[ -n "$found" ] || exit 0
printf '%s\n' "$found"
for ino in $(printf '%s\n' "$found" | awk '{ print $3 }' | sort -u); do
  for fd in $(find /proc/[0-9]*/fd -maxdepth 1 -lname "socket:\[$ino\]" 2>/dev/null); do
    pid=${fd#/proc/}; pid=${pid%%/*}
    # the fields after the command name (which may hold spaces): state ppid pgrp session ...
    st=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
    set -- $st
    cg=$(tail -n 1 "/proc/$pid/cgroup" 2>/dev/null | cut -d: -f3 | tr ' ' '_')
    cmd=$(tr '\000' ' ' < "/proc/$pid/cmdline" 2>/dev/null)
    echo "P $ino $pid $3 $4 ${cg:--} $cmd"
  done
done
"""


@dataclass(frozen=True)
class Holder:
    """One process holding a listening socket."""

    pid: int
    pgid: int
    sid: int
    cgroup: str  # the unified-hierarchy path ("/system.slice/x.service"), "-" when unknown
    command: str

    def describe(self) -> str:
        cmd = self.command if len(self.command) <= 160 else self.command[:157] + "..."
        return f"pid {self.pid} ({cmd or '?'})"


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    inode: int
    holders: tuple[Holder, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        where = f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"
        if not self.holders:
            return f"{where} is held by a process this user cannot see (enable ssh.sudo to name it)"
        return f"{where} is held by " + ", ".join(h.describe() for h in self.holders)


def _address(hex_addr: str) -> str:
    """/proc/net/tcp prints an address as 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_addr)
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(swapped)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


def parse(out: str) -> list[Listener]:
    """The script's output: `L addr:port inode` lines, then `P inode pid pgid sid cgroup cmdline...`."""
    sockets: list[tuple[str, int, int]] = []
    holders: dict[int, list[Holder]] = {}
    for line in out.splitlines():
        words = line.split(" ", 6)
        if words[0] == "L" and len(words) >= 3:
            hex_addr, _, hex_port = words[1].partition(":")
            try:
                sockets.append((_address(hex_addr), int(hex_port, 16), int(words[2])))
            except ValueError:
                continue
        elif words[0] == "P" and len(words) >= 6:
            try:
                ino, pid, pgid, sid = (int(w) for w in words[1:5])
            except ValueError:
                continue
            cmd = words[6].strip() if len(words) > 6 else ""
            holders.setdefault(ino, []).append(Holder(pid, pgid, sid, words[5], cmd))
    seen: set[tuple[str, int, int]] = set()
    result = []
    for addr, port, ino in sockets:
        if (addr, port, ino) in seen:
            continue
        seen.add((addr, port, ino))
        result.append(Listener(addr, port, ino, tuple(holders.get(ino, ()))))
    return result


def listeners(conn: Connector, ports: Sequence[int], *, sudo: bool) -> list[Listener]:
    res = conn.run(Command("sh", "-c", _LISTENERS, "inferctl", *map(str, ports)), sudo=sudo, timeout=60)
    return parse(res.out)


def _wildcard(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_unspecified
    except ValueError:
        return False


def overlaps(listen_addr: str, bind_host: str) -> bool:
    """Would binding `bind_host` collide with a socket listening on `listen_addr`? A bind host that is a
    name, not an address, is taken to collide (it cannot be resolved the way the node would)."""
    if _wildcard(listen_addr) or _wildcard(bind_host):
        return True
    try:
        return ipaddress.ip_address(listen_addr) == ipaddress.ip_address(bind_host.strip("[]"))
    except ValueError:
        return True


def instance_ports(inst: Instance) -> list[tuple[str, int]]:
    """(bind address, port) pairs the instance's server listens on: HTTP and a prefill's bootstrap server
    on --host; a multi-node rank 0 also serves the dist-init store. Ranks > 0 listen on nothing fixed."""
    if not inst.is_leader:
        return []
    pairs = [(inst.bind_host, inst.port)]
    if inst.role == "prefill" and inst.bootstrap_port:
        pairs.append((inst.bind_host, inst.bootstrap_port))
    if inst.nnodes > 1 and inst.dist_init_addr:
        host, _, port = inst.dist_init_addr.rpartition(":")
        pairs.append((host.strip("[]"), int(port)))
    return pairs


def on_instance_ports(found: Sequence[Listener], inst: Instance) -> list[Listener]:
    pairs = instance_ports(inst)
    return [ln for ln in found if any(ln.port == p and overlaps(ln.address, h) for h, p in pairs)]


@dataclass(frozen=True)
class Owner:
    """The process tree `launch` started: a session (setsid pid) or a systemd unit's cgroup."""

    session: int | None = None
    unit: str | None = None

    def owns(self, h: Holder) -> bool:
        if self.session is not None and self.session in (h.pid, h.pgid, h.sid):
            return True
        if self.unit is not None:
            return h.cgroup.endswith("/" + self.unit) or f"/{self.unit}/" in h.cgroup
        return False


def foreign(found: Sequence[Listener], owner: Owner | None) -> list[Listener]:
    """Listeners not held (only) by `owner`'s processes; a listener with no visible holder is foreign."""
    out = []
    for ln in found:
        if not ln.holders or owner is None or not any(owner.owns(h) for h in ln.holders):
            out.append(ln)
    return out
