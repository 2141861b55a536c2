"""Who holds an instance's ports (launch/ports.py): the /proc parser on real and recorded output."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator

import pytest

from infer_ctl.core.sglang import find_instance
from infer_ctl.launch import ports
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.remote.local import LocalConnector

# /proc/net/tcp{,6} address words as the kernel prints them (little-endian 32-bit words)
RECORDED = """\
L 0100007F:7530 4242
L 00000000000000000000000000000000:22B6 4343
L 0000000000000000FFFF00000B00000A:7531 4444
P 4242 900 900 900 /system.slice/inferctl-sglang-prefill.service /opt/venv/bin/python -m sglang.launch_server --port 30000
P 4242 901 900 900 /system.slice/inferctl-sglang-prefill.service python -c from multiprocessing.spawn import spawn_main
P 4444 77 70 60 /user.slice/session-3.scope python3 -m http.server 30001
"""


def test_parse_recorded_output() -> None:
    found = ports.parse(RECORDED)
    assert [(ln.address, ln.port, ln.inode, len(ln.holders)) for ln in found] == [
        ("127.0.0.1", 30000, 4242, 2),
        ("::", 8886, 4343, 0),
        ("10.0.0.11", 30001, 4444, 1),  # IPv4-mapped in tcp6
    ]
    h = found[0].holders[0]
    assert (h.pid, h.pgid, h.sid, h.cgroup) == (900, 900, 900, "/system.slice/inferctl-sglang-prefill.service")
    assert h.command == "/opt/venv/bin/python -m sglang.launch_server --port 30000"
    assert found[1].describe() == "[::]:8886 is held by a process this user cannot see (enable ssh.sudo to name it)"
    assert found[2].describe() == "10.0.0.11:30001 is held by pid 77 (python3 -m http.server 30001)"
    unit = ports.Owner(unit="inferctl-sglang-prefill.service")
    assert ports.foreign(found, unit) == found[1:]  # a listener with no visible holder is never ours
    assert ports.foreign(found[:1], ports.Owner(session=900)) == []
    assert ports.foreign(found[:1], ports.Owner(session=901)) == []  # a process of the session
    assert ports.foreign(found[:1], ports.Owner(session=5)) == found[:1]
    assert ports.foreign(found[:1], None) == found[:1]


@pytest.mark.parametrize(("listen", "bind", "collide"), [
    ("127.0.0.1", "127.0.0.1", True), ("127.0.0.1", "127.0.0.2", False), ("0.0.0.0", "10.0.0.1", True),
    ("10.0.0.1", "0.0.0.0", True), ("::", "10.0.0.1", True), ("10.0.0.1", "node-01.example", True),
])  # fmt: skip
def test_overlaps(listen: str, bind: str, collide: bool) -> None:
    assert ports.overlaps(listen, bind) is collide


def test_instance_ports() -> None:
    profile = validate_profile_data({
        "name": "t",
        "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8},
                  {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8},
                  {"name": "dc-02", "host": "10.0.0.22", "roles": ["decode"], "gpus": 8}],
        "models": {"target": {"path": "/m", "tp": 16}},
        "sglang": {"prefill": {"tp": 8}, "dist_init_port": 5000},
    })  # fmt: skip
    assert ports.instance_ports(find_instance(profile, "pf-01-prefill")) == [("10.0.0.11", 30000), ("10.0.0.11", 8998)]
    assert ports.instance_ports(find_instance(profile, "dc-01-decode")) == [("10.0.0.21", 30001), ("10.0.0.21", 5001)]
    assert ports.instance_ports(find_instance(profile, "dc-02-decode")) == []  # rank 1 serves nothing fixed


@pytest.fixture
def listening() -> Iterator[tuple[str, int]]:
    host = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    sock = socket.socket()
    sock.bind((host, 0))
    sock.listen()
    try:
        yield host, sock.getsockname()[1]
    finally:
        sock.close()


def test_listeners_names_the_real_holder(listening: tuple[str, int]) -> None:
    host, port = listening
    found = ports.listeners(LocalConnector("here"), [port], sudo=False)
    assert [(ln.address, ln.port) for ln in found] == [(host, port)]
    (holder,) = found[0].holders
    assert holder.pid == os.getpid()
    assert (holder.pgid, holder.sid) == (os.getpgid(0), os.getsid(0))
    assert "pytest" in holder.command or "python" in holder.command
    assert ports.foreign(found, ports.Owner(session=os.getsid(0))) == []
    assert ports.listeners(LocalConnector("here"), [1], sudo=False) == []
