"""`inferctl pd control`'s bad input: refused with exit 64 before the router is asked (it is not running
here, which would be exit 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main

PROFILE: dict[str, Any] = {
    "name": "pdcli",
    "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
              {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
    "models": {"target": {"path": "/m/t", "tp": 8}},
    "router": {"listen": "127.0.0.1:1"},
    "sglang": {"pd_role_switch": True},
    "pd": {"control": "advise"},
}


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf"])
def test_a_bad_interval_is_a_usage_error(interval: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    # NaN passed `interval <= 0` and raised in the loop's sleep after the first round
    assert main(["pd", "control", "-p", str(path), "--interval", interval, "--state", str(tmp_path / "s.json")]) == 64
    assert "--interval must be a finite number > 0" in capsys.readouterr().err


def test_off_is_a_usage_error_and_an_absent_router_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "pd": {"control": "off"}}))
    assert main(["pd", "control", "-p", str(path), "--once"]) == 64
    assert "pd.control is off" in capsys.readouterr().err
    path.write_text(yaml.safe_dump(PROFILE))
    assert main(["pd", "control", "-p", str(path), "--once", "--state", str(tmp_path / "s.json")]) == 3
    assert "not reachable" in capsys.readouterr().err
