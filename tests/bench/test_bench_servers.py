"""scripts/servers.py, the benchmark scripts' readiness wait: a server answering on the port is measured
only if it is the process the script started. Real processes on loopback: a foreign HTTP server that
holds the port first (the started one cannot bind), or binds it beside the started one (SO_REUSEPORT
on both, as `router serve` sets it), used to answer the scripts' polls of /health and be measured."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.ports import free_port
from tests.waiting import wait_for

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

#: an HTTP server answering 200 to every GET; argv: port, "reuseport" or ""
SERVER = """
import http.server, socket, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
class S(http.server.HTTPServer):
    def server_bind(self):
        if sys.argv[2]:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
S(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


servers = _load("servers")


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(port: int, reuseport: bool = False) -> subprocess.Popen[bytes]:
        procs.append(subprocess.Popen([sys.executable, "-c", SERVER, str(port), "reuseport" if reuseport else ""],
                                      stderr=subprocess.DEVNULL))
        return procs[-1]

    yield start
    servers.stop_all(procs)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_started_server_alone_is_ready(spawn) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    ours = spawn(port)
    servers.wait_ready(url, ours, lambda: _answers(url), "the stand-in", timeout=30)
    assert servers.foreign_listeners(port, ours.pid) is None


@pytest.mark.parametrize("reuseport", [False, True], ids=["port-taken", "beside-it"])
def test_a_foreign_server_on_the_port_fails_the_start_naming_it(spawn, reuseport: bool) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    foreign = spawn(port, reuseport)
    assert wait_for(lambda: _answers(url), timeout=30)
    ours = spawn(port, reuseport)  # cannot bind (port-taken) or binds beside the foreign one
    with pytest.raises(SystemExit) as exc:
        servers.wait_ready(url, ours, lambda: _answers(url), "the stand-in", timeout=30)
    assert f"pid {foreign.pid} " in str(exc.value), exc.value


def test_the_overhead_benchmark_waits_through_it(spawn, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_router_overhead's wait_http (bench_router_stream_cpu's too) polled for a 200 only."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    overhead = _load("bench_router_overhead")
    port = free_port()
    foreign = spawn(port, True)
    url = f"http://127.0.0.1:{port}/health"
    assert wait_for(lambda: _answers(url), timeout=30)
    with pytest.raises(SystemExit) as exc:
        overhead.wait_http(url, spawn(port, True))
    assert f"pid {foreign.pid} " in str(exc.value)
    servers.stop_all([foreign])
    port = free_port()
    overhead.wait_http(f"http://127.0.0.1:{port}/health", spawn(port))


#: a listener that forks a worker holding its sockets at start (argv[3] of them) and on each SIGUSR1;
#: argv: port, the addresses to listen on ("127.0.0.1,::1"), workers; prints "ready" once listening
FORKING = """
import os, signal, socket, sys, time
socks = []
for host in sys.argv[2].split(","):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if ":" in host:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, int(sys.argv[1]))); s.listen(); socks.append(s)
def fork(*_):
    if os.fork() == 0:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        while True: signal.pause()
for _ in range(int(sys.argv[3])): fork()
signal.signal(signal.SIGUSR1, fork)
print("ready", flush=True)
while True: signal.pause()
"""


@pytest.fixture
def forking() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(port: int, hosts: str, workers: int = 0) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", FORKING, str(port), hosts, str(workers)], stdout=subprocess.PIPE,
                             start_new_session=True)
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        return p

    yield start
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_ipv4_and_ipv6_listeners_of_the_server_and_its_forked_workers_are_its_own(forking) -> None:
    port = free_port()
    ours = forking(port, "127.0.0.1,::1", workers=2)
    assert len(servers.listening_inodes(port)) == 2  # /proc/net/tcp and tcp6
    assert servers.foreign_listeners(port, ours.pid) is None


def test_a_foreign_ipv6_listener_on_the_port_is_named(forking) -> None:
    port = free_port()
    ours = forking(port, "127.0.0.1")
    other = forking(port, "::1")
    assert f"pid {other.pid} " in (servers.foreign_listeners(port, ours.pid) or "")


def test_a_worker_forked_while_proc_is_read_is_the_servers(forking, monkeypatch: pytest.MonkeyPatch) -> None:
    """The process tree was read before the sockets' owners: a worker the server forked in between (a
    server starting its workers as it answers, a router restarting a process) held the listening socket
    and was not among the descendants: the server's own worker was named foreign."""
    port = free_port()
    ours = forking(port, "127.0.0.1")
    real = servers.socket_owners

    def forks_first(inodes: set[int]) -> dict[int, set[int]]:
        before = servers.descendants(ours.pid)
        os.kill(ours.pid, signal.SIGUSR1)
        assert wait_for(lambda: len(servers.descendants(ours.pid)) > len(before), timeout=10)
        return real(inodes)

    monkeypatch.setattr(servers, "socket_owners", forks_first)
    assert servers.foreign_listeners(port, ours.pid) is None
