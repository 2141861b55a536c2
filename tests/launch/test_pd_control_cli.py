"""`inferctl pd control`'s bad input: refused with exit 64 before the router is asked (it is not running
here, which would be exit 3); a round skipped because another controller holds the lock: exit 3, said."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.profile.load import validate_profile_data
from tests.launch.locked_round import assert_skipped

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


@pytest.mark.parametrize("json_out", [True, False])
def test_a_round_skipped_for_the_lock_says_so_and_exits_3(json_out: bool, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    state = tmp_path / "s.json"
    holder = PdControlLoop(validate_profile_data(PROFILE), router_url="http://127.0.0.1:1", mode="advise",
                           state_path=state)
    with holder._exclusive() as mine:
        assert mine
        # the router is absent: a round that ran would exit 3 "not reachable"; a skipped one asks nothing
        code = main(["pd", "control", "-p", str(path), "--once", "--state", str(state)] + (["--json"] if json_out else []))
    assert_skipped(code, capsys, state, json_out)


def test_clear_fatal_takes_named_servers_out_of_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(PROFILE))
    state = tmp_path / "s.json"
    prof = validate_profile_data(PROFILE)
    loop = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    loop.state.fatal, loop.state.fatal_down = ["http://a", "http://b"], ["http://a"]
    loop._save_state()
    args = ["pd", "clear-fatal", "-p", str(path), "--state", str(state)]
    assert main(args) == 64  # neither a URL nor --all-fatal
    assert "name the servers to clear" in capsys.readouterr().err
    assert main([*args, "http://a", "http://x", "--json"]) == 1  # http://x was not fatal
    doc = json.loads(capsys.readouterr().out)
    assert (doc["cleared"], doc["not_fatal"], doc["fatal"]) == (["http://a"], ["http://x"], ["http://b"])
    again = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    again._load_state()
    assert (again.state.fatal, again.state.fatal_down) == (["http://b"], [])
    assert main([*args, "--all-fatal"]) == 0
    assert "cleared http://b: pd control may switch it again" in capsys.readouterr().out
    again._load_state()
    assert again.state.fatal == []


def test_clear_fatal_waits_for_the_lock_and_says_who_holds_it(tmp_path: Path) -> None:
    prof = validate_profile_data(PROFILE)
    state = tmp_path / "s.json"
    holder = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    other = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    waited: list[float] = []
    with holder._exclusive():
        assert other.clear_fatal(None, wait_s=0.0, sleep=waited.append) is None
    assert other.last_skip is not None and other.last_skip["holder"]["pid"] == os.getpid()
    assert other.clear_fatal(None, wait_s=0.0) == ([], [])


def test_a_released_lock_names_no_holder(tmp_path: Path) -> None:
    prof = validate_profile_data(PROFILE)
    loop = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=tmp_path / "s.json")
    with loop._exclusive() as mine:
        assert mine
        held = loop._holder()
        assert held is not None and held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    assert loop._holder() is None


@pytest.mark.parametrize("typed", ["http://10.0.0.11:30000/", "10.0.0.11:30000", " http://10.0.0.11:30000 "])
def test_clear_fatal_takes_a_url_as_the_router_spells_it(typed: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # the router keeps a worker's URL without a trailing slash and with http:// (admin_http.norm_url): the
    # same server typed otherwise was "not fatal", exit 1, and stayed fatal
    path, state = tmp_path / "p.yaml", tmp_path / "s.json"
    path.write_text(yaml.safe_dump(PROFILE))
    prof = validate_profile_data(PROFILE)
    loop = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    loop.state.fatal = ["http://10.0.0.11:30000"]
    loop._save_state()
    assert main(["pd", "clear-fatal", "-p", str(path), "--state", str(state), "--json", typed]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["cleared"], doc["not_fatal"], doc["fatal"]) == (["http://10.0.0.11:30000"], [], [])
