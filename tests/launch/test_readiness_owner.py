"""Ready means the server WE started answers: an answer on the port from another process (an orphan of an
earlier launch) while ours is still loading is not readiness.

Real: the process supervisor's start script, /proc, HTTP. Local connector (this machine is the node).
Stand-ins: "our" server is a small program carrying the `sglang.launch_server` mark that never binds the
port (a server still loading its weights); the other one is tests/launch/standin_sglang.py (a simulated
SGLang worker, answering /health and /server_info), started by hand so no pid file names it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from infer_ctl.core.sglang import find_instance
from infer_ctl.launch import supervisor
from infer_ctl.launch.orchestrate import Applied, wait_ready
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.remote.fleet import Fleet
from infer_ctl.remote.local import LocalConnector
from tests.launch.standin_cluster import STANDIN
from tests.sshd_harness import free_port

pytest.importorskip("infer_ctl.sim.server", reason="the simulator (infer_ctl.sim) is not available")

LOADING = "import time\nwhile True:\n    time.sleep(0.05)\n"


def test_an_answer_from_another_process_is_not_readiness(tmp_path: Path) -> None:
    host = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
    port, boot = free_port(host), free_port(host)
    profile = validate_profile_data({
        "name": "t",
        "nodes": [{"name": "pf-01", "host": host, "connection": "local", "roles": ["prefill"]},
                  {"name": "dc-01", "host": "127.0.0.1", "connection": "local", "roles": ["decode"]}],
        "models": {"target": {"path": str(tmp_path)}},
        "sglang": {"prefill": {"port": port, "bootstrap_port": boot},
                   "lifecycle": {"config_dir": str(tmp_path / "etc")}, "log_dir": str(tmp_path / "log")},
    })  # fmt: skip
    inst = find_instance(profile, "pf-01-prefill")
    conn = LocalConnector("pf-01")
    supervisor.ensure_dirs(conn, inst, sudo=False)
    (tmp_path / "etc" / "sglang-prefill.env").write_text("PYTHONUNBUFFERED=1\n")
    loading = tmp_path / "loading.py"
    loading.write_text(LOADING)
    Path(supervisor.run_file_path(inst)).write_text(
        f"#!/bin/sh\nexec {sys.executable} {loading} -m sglang.launch_server --port {port}\n"
    )
    other = subprocess.Popen(
        [sys.executable, str(STANDIN), "-m", "sglang.launch_server", "--model-path", str(tmp_path),
         "--host", host, "--port", str(port), "--disaggregation-mode", "prefill",
         "--disaggregation-bootstrap-port", str(boot)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{inst.url}/health", timeout=1, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and other.poll() is None
            time.sleep(0.2)
        supervisor.start(conn, inst, "process", sudo=False, unit_changed=False)
        with Fleet(profile) as fleet:
            (r,) = wait_ready(fleet, profile, [Applied(inst, "process", "started")], timeout_s=3, poll_s=0.2)
        assert r.state == "failed", r
        assert r.error is not None
        assert r.error.startswith("not healthy after 3 s (process still running); meanwhile ")
        assert f"{host}:{port} is held by pid {other.pid} (" in r.error and "answered on its port" in r.error
    finally:
        supervisor.stop(conn, inst, "process", sudo=False, timeout_s=5)
        os.killpg(other.pid, signal.SIGTERM)
        other.wait(10)
