"""A SIGKILLed single-process router's admin socket is swept at the next start (only
the dead router's: a live one's directory, and another user's, stay)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from infer_ctl.router.daemon.admin_dir import PREFIX, make_admin_dir, sweep_stale

_ROUTER_LIKE = """
import socket, sys, time
from infer_ctl.router.daemon.admin_dir import make_admin_dir
path, _fd = make_admin_dir(sys.argv[1])
s = socket.socket(socket.AF_UNIX); s.bind(path + "/admin.sock"); s.listen()
print(path, flush=True)
time.sleep(600)
"""


def _start(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    p = subprocess.Popen([sys.executable, "-c", _ROUTER_LIKE, str(tmp)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    return p, p.stdout.readline().strip()


def test_a_killed_routers_admin_dir_is_swept_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    dead, dead_dir = _start(tmp_path)
    live, live_dir = _start(tmp_path)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        assert Path(dead_dir, "admin.sock").exists()  # what SIGKILL left behind
        mine, fd = make_admin_dir(str(tmp_path))  # the next start
        try:
            assert not Path(dead_dir).exists()
            assert Path(live_dir, "admin.sock").exists()
            assert Path(mine).is_dir() and oct(Path(mine).stat().st_mode & 0o777) == "0o700"
            assert sweep_stale(str(tmp_path)) == []  # my own directory is held by my lock
        finally:
            os.close(fd)
    finally:
        live.kill()
        live.wait(10)
    assert set(sweep_stale(str(tmp_path))) == {live_dir, mine}  # both owners gone now
    assert not Path(live_dir).exists()


def test_an_older_routers_dir_without_a_lock_is_swept_only_when_nobody_listens(tmp_path: Path) -> None:
    listening = tmp_path / f"{PREFIX}listening"
    dead = tmp_path / f"{PREFIX}dead"
    empty = tmp_path / f"{PREFIX}starting"
    for d in (listening, dead, empty):
        d.mkdir(mode=0o700)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(listening / "admin.sock"))
    s.listen()
    t = socket.socket(socket.AF_UNIX)
    t.bind(str(dead / "admin.sock"))
    t.close()  # the socket file stays, nobody listens: a SIGKILLed router's
    try:
        assert sweep_stale(str(tmp_path)) == [str(dead)]
        assert listening.exists() and empty.exists()
    finally:
        s.close()
