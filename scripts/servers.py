"""The servers the benchmark scripts start as child processes: their teardown."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable


def stop_all(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM every process, the last started first (a proxy before the workers it talks to), then
    wait for each, killing the ones still there after `timeout` seconds."""
    procs = list(procs)
    for p in reversed(procs):
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
