"""The servers the benchmark scripts start as child processes: a free port, a readiness wait that makes
sure the server answering is the one started, and the teardown.

A port from `free_port` is free when it is picked, not when the child binds it a second later: another
process (a second benchmark on a shared machine, a router left over from an earlier run) can take it in
between. The child then fails to bind and exits, or, with SO_REUSEPORT on both sides (`router serve`
sets it for its processes), binds beside the other and the kernel splits the connections between the
two. Either way a readiness check that only asks the port for a 200 is answered by the foreign server,
and the benchmark measures it. `wait_ready` therefore fails when the child exits before it answers, and
once something answers it checks, from /proc (Linux; elsewhere the check is skipped), that every socket
listening on the port belongs to the child or one of its descendants (a router's processes, a launcher's
server).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from urllib.parse import urlsplit

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_inodes(port: int) -> set[int]:
    """The inodes of the sockets listening on `port` (IPv4 and IPv6, any address), from /proc/net."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == _LISTEN and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(f[9]))
    return inodes


def socket_owners(inodes: set[int]) -> dict[int, set[int]]:
    """pid -> the inodes of `inodes` it holds open, for every process whose fds this user can read."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    owners: dict[int, set[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link in wanted:
                owners.setdefault(int(proc.name), set()).add(wanted[link])
    return owners


def descendants(pid: int) -> set[int]:
    """`pid` and every live process below it (from each process's parent in /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(proc.name))
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo.extend(children.get(p, ()))
    return out


def _cmdline(pid: int) -> str:
    try:
        return " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())[:200]
    except OSError:
        return "?"


def foreign_listeners(port: int, pid: int | None) -> str | None:
    """What listens on `port` other than `pid` and its descendants (pid None: anything listening there);
    None when nothing else does, or when /proc cannot tell (not Linux)."""
    if not Path("/proc/net/tcp").exists():
        return None
    inodes = listening_inodes(port)
    if not inodes:
        return None if pid is None else f"nothing listens on port {port}"
    owners = socket_owners(inodes)
    # the tree after the owners: a worker forked while /proc is walked holds the socket, and is a descendant
    ours = descendants(pid) if pid is not None else set()
    foreign = [f"pid {p} ({_cmdline(p)})" for p in sorted(owners) if p not in ours]
    unseen = inodes - set().union(set(), *owners.values())
    if unseen:
        foreign.append(f"{len(unseen)} socket(s) of a process this user cannot see")
    return "; ".join(foreign) or None


def get_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether a GET of `url` answers 200 (no proxy from the environment: the servers are on loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):  # URLError and HTTPError are OSErrors
        return False


def routes_ok(url: str, timeout: float = 30.0) -> bool:
    """Whether a router at `url` routes: a one-token /generate answers 200 (its /health answers before
    its workers are in). No proxy from the environment, as in `get_ok`."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    body = b'{"text": "ready", "sampling_params": {"max_new_tokens": 1}}'
    req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
    try:
        with opener.open(req, timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def wait_ready(url: str, proc: subprocess.Popen[bytes], answers: Callable[[], bool], what: str = "",
               timeout: float = 60.0, log: str = "") -> None:
    """Wait until `answers()` is true (the server at `url` is up), then make sure the server is `proc`'s:
    SystemExit, saying so, if `proc` exits first, if another process listens on the port too, or after
    `timeout` seconds. `log`: where `proc` writes, named in the messages."""
    what = what or url
    port = urlsplit(url).port
    assert port is not None, url
    see = f" (see {log})" if log else ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            held = foreign_listeners(port, None)
            raise SystemExit(f"{what} exited with code {code} before it answered at {url}{see}"
                             + (f"; port {port} is held by {held}" if held else ""))
        if answers():
            other = foreign_listeners(port, proc.pid)
            if other is not None:
                raise SystemExit(f"{url} answers, but not only {what} (pid {proc.pid}) listens on port {port}: {other}. "
                                 "Stop that process (or rerun: the next ports are picked afresh)")
            return
        time.sleep(0.2)
    raise SystemExit(f"{what} did not come up at {url} within {timeout:.0f} s{see}")


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM every process, the last started first (a proxy before the workers it talks to), then
    wait for each, killing the ones still there after `timeout` seconds."""
    procs = list(procs)
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
