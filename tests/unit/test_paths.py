"""inferctl's state directory is defined once (infer_ctl/paths.py) and used by the debug log and the
accepted host keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.cli.main import _debug_log_path
from infer_ctl.paths import state_dir
from infer_ctl.remote.fleet import accepted_known_hosts_path


def test_state_dir_follows_xdg_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert state_dir() == tmp_path / "state" / "inferctl"
    assert _debug_log_path() == tmp_path / "state" / "inferctl" / "debug.log"
    assert accepted_known_hosts_path() == tmp_path / "state" / "inferctl" / "known_hosts"


@pytest.mark.parametrize("value", [None, ""])
def test_state_dir_defaults_to_local_state(
    value: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_STATE_HOME", value)  # empty counts as unset, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path))
    assert state_dir() == tmp_path / ".local" / "state" / "inferctl"
