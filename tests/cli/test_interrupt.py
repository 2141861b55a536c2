"""Ctrl-C says so and exits 130: `exec` exited 130 with no line at all, because typer
0.29 turns a KeyboardInterrupt into a returned 130 before the CLI boundary sees it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infer_ctl.cli.main import main


def _interrupt_after(seconds: float) -> threading.Timer:
    timer = threading.Timer(seconds, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.mark.parametrize("json_mode", [False, True], ids=["text", "json"])
def test_ctrl_c_on_exec_says_interrupted_and_exits_130(json_mode: bool, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    _interrupt_after(1.5)
    argv = ["exec", "-p", "builtin:local", *(["--json"] if json_mode else []), "--", "sleep 30"]
    assert main(argv) == 130
    assert time.monotonic() - started < 20  # the remote commands were killed, not waited for
    out, err = capsys.readouterr()
    assert "inferctl: interrupted" in err
    if json_mode:
        doc = json.loads(out)
        assert (doc["exit_code"], doc["error"]["message"]) == (130, "interrupted")


def test_ctrl_c_while_a_node_never_speaks_ssh_exits_at_once(tmp_path: Path) -> None:
    # a node that accepts TCP and never sends the SSH banner: the worker thread waited out the whole
    # connect timeout (31 s here) before the process could exit, "interrupted" already printed
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    prof = tmp_path / "p.yaml"
    prof.write_text(
        "name: x\ncollocated: true\nssh: {connect_timeout_s: 30}\nmodels: {target: {path: /m, tp: 1}}\n"
        f"nodes:\n  - {{name: a, host: 127.0.0.1, port: {silent.getsockname()[1]}, roles: [prefill, decode], gpus: 1}}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "infer_ctl", "exec", "-p", str(prof), "--", "true"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        conn, _ = silent.accept()  # the handshake has begun
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "inferctl: interrupted" in err
        assert time.monotonic() - started < 10
        conn.close()
    finally:
        silent.close()
