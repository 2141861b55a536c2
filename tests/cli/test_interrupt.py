"""Ctrl-C says so and exits 130: `exec` exited 130 with no line at all, because typer
0.29 turns a KeyboardInterrupt into a returned 130 before the CLI boundary sees it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

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
