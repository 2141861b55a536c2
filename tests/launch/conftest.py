"""Launch tests keep inferctl's controller state (the router registrations a rolling launch took out,
launch/router_hook.py) in the test's own directory, never in the user's ~/.local/state."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
