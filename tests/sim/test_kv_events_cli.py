"""`inferctl sim serve --kv-events-config` as a real process: four workers, each publishing on its own
ports (endpoint and replay port + worker index), discoverable through its /server_info."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from infer_ctl.cli.main import main
from tests.sim.kv_client import END_SEQ, replay


def _free_range(n: int) -> int:
    """A base port with n free ports from it, and n more 100 ports up (for the replay sockets)."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(20_000, 40_000)
        try:
            socks = []
            for p in [*range(base, base + n), *range(base + 100, base + 100 + n)]:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


def test_sim_serve_gives_every_worker_its_own_kv_event_ports() -> None:
    base = _free_range(4)
    cfg = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{base}", "replay_endpoint": f"tcp://*:{base + 100}"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl", "sim", "serve", "--prefill", "2", "--decode", "2", "--time-scale", "0.05",
         "--page-size", "8", "--kv-events-config", cfg, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        workers = doc["workers"]
        assert [w["kv_events"] for w in workers] == [f"tcp://*:{base + i}" for i in range(4)]
        for i, w in enumerate(workers):
            kv = httpx.get(w["url"] + "/server_info", timeout=5).json()["kv_events"]
            assert (kv["endpoint_port_base"], kv["replay_endpoint_port_base"]) == (base + i, base + 100 + i)
            assert kv["block_size"] == 8 and kv["endpoint_host"] == "*"
            # a subscriber dials the worker's host (the URL's), the advertised port
            first = replay(f"tcp://127.0.0.1:{kv['replay_endpoint_port_base']}", 0)
            assert first[-1][2] == END_SEQ
            assert len(first) == (2 if w["role"] == "prefill" else 1)  # AllBlocksCleared; a decode sends none
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(15)
    assert rc == 0


def test_overlapping_port_ranges_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'
    assert main(["sim", "serve", "--prefill", "2", "--kv-events-config", cfg]) == 64
    err = capsys.readouterr().err
    assert "would bind endpoint port 5558" in err and "replay_endpoint at least 2 ports after endpoint" in err
    assert main(["sim", "serve", "--mixed", "1", "--kv-events-config", '{"publisher":"kafka"}']) == 64
    assert "Unknown event publisher 'kafka'" in capsys.readouterr().err
