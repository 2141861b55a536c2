"""The controllers' lock file `<state>.lock` (launch/control_loop.py `LockedRounds`) against what can be
found in its place: a symbolic link (the holder rewrites the file: through a link, the file it points to),
a directory, a FIFO; and a holder killed -9 mid-round: the kernel releases its flock, and the pid it left
in the file is not named as the holder of a lock someone else now holds."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.profile.load import validate_profile_data
from tests.waiting import wait_for

PROFILE: dict[str, Any] = {
    "name": "lockfile",
    "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
              {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
    "models": {"target": {"path": "/m/t", "tp": 8}},
    "router": {"listen": "127.0.0.1:1"},
    "sglang": {"pd_role_switch": True},
    "pd": {"control": "advise"},
}


def _control(tmp_path: Path, state: Path) -> list[str]:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    return ["pd", "control", "-p", str(path), "--once", "--state", str(state)]


def test_a_symlinked_lock_is_refused_and_its_target_untouched(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "precious.txt"
    victim.write_text("not the controller's\n")
    state = tmp_path / "s.json"
    Path(f"{state}.lock").symlink_to(victim)
    # the router is absent: a round that ran would exit 3; the lock is refused before it: 2, said
    assert main(_control(tmp_path, state)) == 2
    err = capsys.readouterr().err
    assert f"cannot use the controller lock {state}.lock: it is a symbolic link" in err
    assert "internal error" not in err
    assert victim.read_text() == "not the controller's\n"  # it was truncated and overwritten with the holder


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_lock_that_is_not_a_file_is_an_error_not_a_crash(kind: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s.json"
    if kind == "directory":
        Path(f"{state}.lock").mkdir()
    else:
        os.mkfifo(f"{state}.lock")  # a round ran on it, and a skipped round's read of the holder would block
    assert main(_control(tmp_path, state)) == 2
    err = capsys.readouterr().err
    assert f"cannot use the controller lock {state}.lock" in err and "internal error" not in err


_HOLD = """
import sys, time
from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.profile.load import validate_profile_data
import yaml
prof = validate_profile_data(yaml.safe_load(open(sys.argv[1])))
loop = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=sys.argv[2])
with loop._exclusive() as mine:
    print("held" if mine else "not held", flush=True)
    time.sleep(60)
"""


def test_a_holder_killed_mid_round_releases_the_lock_and_is_not_named_after(tmp_path: Path) -> None:
    path, state = tmp_path / "p.yaml", tmp_path / "s.json"
    path.write_text(yaml.safe_dump(PROFILE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(path), str(state)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        prof = validate_profile_data(PROFILE)
        other = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
        assert other.tick() == [] and other.last_skip is not None
        assert other.last_skip["holder"]["pid"] == proc.pid  # alive: named
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert f'"pid": {proc.pid}' in Path(f"{state}.lock").read_text()  # what kill -9 leaves behind
    # the kernel released its flock: the next one takes it
    assert wait_for(lambda: _try_flock(state), 5)
    # a new holder between its flock and writing itself (here: a bare flock): the dead pid is not its holder
    fd = os.open(f"{state}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        other = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
        assert other.tick() == [] and other.last_skip is not None
        assert other.last_skip["holder"] is None
    finally:
        os.close(fd)


def _try_flock(state: Path) -> bool:
    fd = os.open(f"{state}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        time.sleep(0.05)
        return False
    finally:
        os.close(fd)
