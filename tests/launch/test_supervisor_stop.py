"""The managed-process supervisor stops gracefully first: SIGTERM, a wait, and SIGKILL only after the
stop timeout (a killed SGLang leaks RDMA registrations), and the server's children go with it.

Real: the start/stop shell scripts, setsid, signals and /proc, run through the local connector. Stand-in:
the "server" is a small Python program whose command line carries `sglang.launch_server` (the mark the
supervisor checks before signalling a pid) and which forks a child, as SGLang forks its schedulers.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from infer_ctl.core.sglang import find_instance, pid_file_path
from infer_ctl.launch import supervisor
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.remote.local import LocalConnector

STANDIN_SERVER = r"""
import os, signal, subprocess, sys, time
out, ignore_term = sys.argv[1], sys.argv[2] == "ignore"
child = subprocess.Popen(["sleep", "300"])
def on_term(*_):
    with open(out, "a") as f:
        f.write("TERM\n")
    if not ignore_term:
        sys.exit(0)  # like a server that exits but leaves a child behind
signal.signal(signal.SIGTERM, on_term)
with open(out, "a") as f:
    f.write(f"ready {child.pid}\n")
while True:
    time.sleep(0.05)
"""


def _setup(tmp_path: Path, mode: str) -> tuple[LocalConnector, object, Path]:
    profile = validate_profile_data(
        {
            "name": "t",
            "nodes": [
                {"name": "pf-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"]},
                {"name": "dc-01", "host": "127.0.0.2", "connection": "local", "roles": ["decode"]},
            ],
            "models": {"target": {"path": "/m"}},
            "sglang": {"lifecycle": {"config_dir": str(tmp_path / "etc")}, "log_dir": str(tmp_path / "log")},
        }
    )
    inst = find_instance(profile, "pf-01-prefill")
    conn = LocalConnector("pf-01")
    supervisor.ensure_dirs(conn, inst, sudo=False)
    (tmp_path / "etc" / "sglang-prefill.env").write_text("PYTHONUNBUFFERED=1\n")
    script = tmp_path / "server.py"
    script.write_text(STANDIN_SERVER)
    out = tmp_path / "signals.txt"
    # argv[0] of the exec'd process is python; `sglang.launch_server` in its argv is the supervisor's mark
    Path(supervisor.run_file_path(inst)).write_text(
        f"#!/bin/sh\nexec {sys.executable} {script} {out} {mode} -m sglang.launch_server\n"
    )
    supervisor.start(conn, inst, "process", sudo=False, unit_changed=False)
    deadline = time.monotonic() + 15
    while not (out.exists() and out.read_text().startswith("ready")):
        assert time.monotonic() < deadline, "stand-in server did not start"
        time.sleep(0.05)
    return conn, inst, out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill -0; it no longer runs
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_a_server_ignoring_sigterm_is_killed_only_after_the_timeout(tmp_path: Path) -> None:
    conn, inst, out = _setup(tmp_path, "ignore")
    child = int(out.read_text().split()[1])
    started = time.monotonic()
    result = supervisor.stop(conn, inst, "process", sudo=False, timeout_s=1.0)  # type: ignore[arg-type]
    waited = time.monotonic() - started
    assert result == "killed"
    assert "TERM" in out.read_text().split()  # SIGTERM came first ...
    assert waited >= 1.0  # ... and SIGKILL only after the graceful window
    time.sleep(0.2)
    assert not _alive(child), "the server's child outlived a forced stop"
    assert not Path(pid_file_path(inst)).exists()  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout_s", [5.0])
def test_a_server_exiting_on_sigterm_is_stopped_and_its_leftover_child_too(tmp_path: Path, timeout_s: float) -> None:
    conn, inst, out = _setup(tmp_path, "exit")
    child = int(out.read_text().split()[1])
    started = time.monotonic()
    assert supervisor.stop(conn, inst, "process", sudo=False, timeout_s=timeout_s) == "stopped"  # type: ignore[arg-type]
    assert time.monotonic() - started < timeout_s  # no wait for the full window when it exits
    time.sleep(0.2)
    assert not _alive(child)
    assert supervisor.stop(conn, inst, "process", sudo=False, timeout_s=timeout_s) == "not-running"  # type: ignore[arg-type]
