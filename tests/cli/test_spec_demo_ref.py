"""The spec-drift demo's `apply with:` command names the profile the demo was given, not always
`-p builtin:local`."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.bench import spec_demo
from infer_ctl.cli.main import main
from infer_ctl.resources import builtin_profile_path


class _Stop(Exception):
    pass


def test_controller_is_given_the_demo_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    local = builtin_profile_path("local")
    assert local is not None
    mine = tmp_path / "mine.yaml"
    shutil.copy(local, mine)
    seen: dict[str, Any] = {}

    def loop(*args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Stop  # the loop's arguments are all this test needs: no traffic, no relaunch

    monkeypatch.setattr(spec_demo, "SpecControlLoop", loop)
    monkeypatch.setenv("INFERCTL_DEBUG", "0")
    assert main(["demo", "--scenario", "spec-drift", "-p", str(mine)]) == 2
    assert seen["profile_ref"] == str(mine)
