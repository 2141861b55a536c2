"""scripts/servers.py, the benchmark scripts' readiness wait: a server answering on the port is measured
only if it is the process the script started. Real processes on loopback: a foreign HTTP server that
holds the port first (the started one cannot bind), or binds it beside the started one (SO_REUSEPORT
on both, as `router serve` sets it), used to answer the scripts' polls of /health and be measured."""

from __future__ import annotations

import importlib.util
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
