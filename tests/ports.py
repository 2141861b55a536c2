"""Ports for servers that bind them later (a child process, a worker started from a config): one helper
for every test module.

A port from bind(("127.0.0.1", 0)) is in the kernel's ephemeral range, the range every outgoing
connection of this machine takes its local port from. Between the moment it is picked and the moment
the server binds it, any connection (the suite and whatever else shares the machine open thousands) may
take it, and the server's bind fails with EADDRINUSE even with SO_REUSEADDR (a loaded full-suite run:
the simulator's KV-events socket, `tests/router/scaleout/test_processes.py`'s module fixture). So these
ports are picked below that range, where only an explicit bind can take them.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: the lowest port picked (below: well-known and registered services)
LOW = 10000


def ephemeral_range() -> tuple[int, int]:
    """net.ipv4.ip_local_port_range (Linux); 32768-60999, its default, where it cannot be read."""
    try:
        lo, hi = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_range(n: int = 1, host: str = "127.0.0.1") -> int:
    """A base port whose n ports (base .. base + n - 1) are free on `host` now, below the ephemeral range.
    Falls back to the kernel's choice where that range leaves no room below it."""
    lo, _ = ephemeral_range()
    rng = random.SystemRandom()
    if lo - n > LOW:
        for _ in range(200):
            base = rng.randrange(LOW, lo - n)
            if all(_bindable(host, p) for p in range(base, base + n)):
                return base
    for _ in range(50):  # no room below: the kernel's choice, checked
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            base = int(s.getsockname()[1])
        if base + n <= 65535 and all(_bindable(host, p) for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no {n} free consecutive ports on {host}")


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a server that binds it later."""
    return free_port_range(1, host)
