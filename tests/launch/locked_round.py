"""What a fleet controller (`spec control`, `pd control`) prints when its only round was skipped because
another controller held the state lock (launch/control_loop.py `LockedRounds`): one check for both."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest


def assert_skipped(code: int, out: pytest.CaptureFixture[str], state: Path, json_out: bool) -> dict[str, Any]:
    """Exit 3 without asking the router; --json: `skipped` names the lock and this process as its holder,
    human: the line says so. Returns the --json document (empty in human mode)."""
    got = out.readouterr()
    assert code == 3
    assert "not reachable" not in got.err  # the router is absent: a round that ran would say so
    if not json_out:
        assert f"skipped: another controller (pid {os.getpid()} on {socket.gethostname()}" in got.out
        assert f"holds {state}.lock: this round did not run" in got.out
        return {}
    doc = json.loads(got.out)
    assert doc["exit_code"] == 3 and doc["status"] == "unknown"
    skip = doc["skipped"]
    assert skip["reason"] == "locked" and skip["lock"] == f"{state}.lock"
    assert skip["holder"]["pid"] == os.getpid() and skip["holder"]["host"] == socket.gethostname()
    assert doc["actions"] == [] and doc["skipped_rounds"] == 1
    return doc
