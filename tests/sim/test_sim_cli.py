"""`inferctl sim serve` as a real process (SIGTERM stops it cleanly) and its argument parsing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.specparse import parse_worker


def test_parse_worker() -> None:
    w = parse_worker("prefill@127.0.0.5:30000/8998", seed=3)
    assert (w.role, w.host, w.port, w.bootstrap_port, w.seed) == ("prefill", "127.0.0.5", 30000, 8998, 3)
    assert parse_worker("decode").port == 0
    for bad, why in (("prefil", "role must be one of"), ("decode@h:1/2", "only a prefill"), ("x@", "expected ROLE")):
        with pytest.raises(ValueError, match=why):
            parse_worker(bad)


def test_sim_serve_without_workers_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "serve"]) == 64
    assert "no workers" in capsys.readouterr().err


def test_a_negative_worker_count_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    # --prefill -1 read "no workers to serve" (with --decode 1: it served one decode, silently)
    assert main(["sim", "serve", "--prefill", "-1", "--decode", "1"]) == 64
    assert "--prefill must be a count >= 0, got -1" in capsys.readouterr().err


def test_sim_serve_process_serves_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "infer_ctl", "sim", "serve", "--prefill", "1", "--decode", "1", "--time-scale", "0.05",
         "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        doc = json.loads(proc.stdout.readline())
        roles = [w["role"] for w in doc["workers"]]
        assert roles == ["prefill", "decode"] and doc["workers"][0]["bootstrap_port"]
        for w in doc["workers"]:
            assert httpx.get(w["url"] + "/health", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(15)
    assert rc == 0
