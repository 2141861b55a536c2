"""`inferctl pd control` stopped by SIGTERM (systemd's stop) or Ctrl-C while a switch runs: the switch is
finished, recorded and saved, then the command stops. It died at once: the server was left drained half
way through its switch, in no record and no state (no cool-down, no `fatal`), and the next round took the
drained server for one down and borrowed another to cover it. A second signal still stops at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.launch.test_pd_control_e2e import PROFILE

# the real command in act mode; its router view (the decode pool far over its ITL objective) and the
# switch (slow: a drain and a rebuild) replaced, as tests/launch/test_pd_control_e2e.py replaces the view
_RUN = """
import sys, time
from pathlib import Path
from infer_ctl.cli.main import main
from infer_ctl.core.pd.control import Observation, Server, Window
from infer_ctl.launch import pd_control, pd_switch

log = Path(sys.argv[1])

def observe(self):
    servers = (Server("http://p0", "prefill"), Server("http://p1", "prefill"), Server("http://d0", "decode"))
    return Observation(servers, Window(50, 0.1, 1.0, 100.0, 500.0), 0.1)

def switch(self, url, from_role, to_role):
    with log.open("a") as f:
        f.write(f"start {url}\\n")
    time.sleep(float(sys.argv[2]))
    with log.open("a") as f:
        f.write(f"end {url}\\n")
    return pd_switch.SwitchResult(True, "moved")

pd_control.PdControlLoop.observe = observe
pd_switch.RoleSwitcher.switch = switch
sys.exit(main(sys.argv[3:]))
"""


def _start(tmp_path: Path, once: bool, switch_s: float) -> tuple[subprocess.Popen[str], Path, Path]:
    path, state, log = tmp_path / "p.yaml", tmp_path / "s.json", tmp_path / "switches.log"
    path.write_text(yaml.safe_dump({**PROFILE, "router": {"listen": "127.0.0.1:1"}}))
    args = ["pd", "control", "-p", str(path), "--state", str(state), "--history", str(tmp_path / "h.jsonl"), "--json"]
    args += ["--once"] if once else ["--interval", "60"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _RUN, str(log), str(switch_s), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (log.exists() and "start" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc, state, log


@pytest.mark.parametrize(("sig", "once"), [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)])
def test_a_signal_mid_switch_finishes_the_round_then_stops(sig: int, once: bool, tmp_path: Path) -> None:
    proc, state, log = _start(tmp_path, once, 1.5)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err  # a server moved (the loop's next round, 60 s later, never starts)
    assert log.read_text().splitlines() == ["start http://p0", "end http://p0"]
    doc = json.loads(out)
    assert [r["action"] for r in doc["actions"]] == ["switch"]
    assert json.loads(state.read_text())["state"]["last_switch_at"] is not None  # the cool-down kept
    assert [json.loads(line)["action"] for line in (tmp_path / "h.jsonl").read_text().splitlines()] == ["switch"]


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    proc, _, log = _start(tmp_path, False, 30)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None  # the first: the switch goes on
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert log.read_text().splitlines() == ["start http://p0"]


_SPEC_RUN = """
import sys, time
from pathlib import Path
from infer_ctl.cli.main import main
from infer_ctl.core.spec.controller import PoolObservation
from infer_ctl.launch import spec_control, spec_relaunch

log = Path(sys.argv[1])

def apply(self, pool, change):
    with log.open("a") as f:
        f.write(f"start {pool.name}\\n")
    time.sleep(1.5)
    with log.open("a") as f:
        f.write(f"end {pool.name}\\n")
    return spec_control.ActionResult(True, "relaunched")

spec_control.SpecControlLoop.observe = lambda self: [PoolObservation("dc-01", 0.3, 40, 3)]
spec_relaunch.SshRelauncher.apply = apply
sys.exit(main(sys.argv[2:]))
"""


def test_spec_control_finishes_its_relaunch_on_sigterm(tmp_path: Path) -> None:
    from tests.launch.test_spec_control_lock import PROFILE as SPEC

    path, state, log = tmp_path / "p.yaml", tmp_path / "s.json", tmp_path / "relaunches.log"
    path.write_text(yaml.safe_dump(SPEC))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _SPEC_RUN, str(log), "spec", "control", "-p", str(path),
                             "--state", str(state), "--interval", "60", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (log.exists() and "start" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert log.read_text().splitlines() == ["start dc-01", "end dc-01"]
    assert [r["action"] for r in json.loads(out)["actions"]] == ["alert", "relaunch"]
    assert json.loads(state.read_text())["last_change_at"] is not None
