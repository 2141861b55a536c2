"""A controller's state file that is there but does not read (cut short, edited by hand, another file):
an error naming it, the file left as it is. It was read as an empty state, and the round saved over it:
`pd control` forgot the servers it had marked fatal (a failed rebuild retried), `spec control` its
cool-down, and `pd clear-fatal` wiped the lot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.launch.control_loop import StateFileError
from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.launch.spec_control import SpecControlLoop
from infer_ctl.profile.load import validate_profile_data
from tests.launch.test_pd_control_cli import PROFILE as PD
from tests.launch.test_spec_control_lock import PROFILE as SPEC

GOOD = {"state": {"want": None, "since": None, "last_switch_at": 100.0, "fatal": ["http://10.0.0.11:30000"],
                  "covers": {}, "queue_ema": {}, "fatal_down": []}, "counters": None}
BROKEN = {
    "cut short": json.dumps(GOOD)[:-7],
    "not an object": "[1, 2]\n",
    "fatal not a list": json.dumps({**GOOD, "state": {**GOOD["state"], "fatal": "http://10.0.0.11:30000"}}),
    "no state": json.dumps({"counters": None}),
    "not utf-8": '{"state": {"fatal": ["\xff"]}}',
}


def _write(state: Path, text: str) -> bytes:
    state.write_bytes(text.encode("latin-1"))
    return state.read_bytes()


@pytest.mark.parametrize("how", list(BROKEN))
def test_pd_control_and_clear_fatal_refuse_a_broken_state_and_keep_it(how: str, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path, state = tmp_path / "p.yaml", tmp_path / "s.json"
    path.write_text(yaml.safe_dump(PD))
    before = _write(state, BROKEN[how])
    # the router is absent: a round that ran would exit 3 "not reachable" (and save the state meanwhile)
    assert main(["pd", "control", "-p", str(path), "--once", "--state", str(state)]) == 2
    err = capsys.readouterr().err
    assert f"the controller state file {state} cannot be read" in err and "move it aside" in err
    assert state.read_bytes() == before
    assert main(["pd", "clear-fatal", "-p", str(path), "--all-fatal", "--state", str(state), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert f"the controller state file {state} cannot be read" in doc["error"]["message"]
    assert state.read_bytes() == before


def test_a_state_broken_between_two_rounds_stops_the_loop_unsaved(tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    state.write_text(json.dumps(GOOD))
    loop = PdControlLoop(validate_profile_data(PD), router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    loop._load_state()
    assert loop.state.fatal == ["http://10.0.0.11:30000"]
    before = _write(state, BROKEN["cut short"])
    with pytest.raises(StateFileError):
        loop.tick()
    assert state.read_bytes() == before


@pytest.mark.parametrize("text", ['{"last_change_at": 5.0, "pools": {"dc-01": {"below_si',
                                  '{"last_change_at": "yesterday", "pools": {}}',
                                  '{"last_change_at": 5.0, "pools": {"dc-01": {"changed": [4]}}}'])
def test_spec_control_refuses_a_broken_state_and_keeps_it(text: str, tmp_path: Path) -> None:
    state = tmp_path / "s.json"
    state.write_text(text)
    args: dict[str, Any] = {"router_url": "http://127.0.0.1:1", "mode": "advise", "state_path": state}
    with pytest.raises(StateFileError, match="cannot be read"):
        SpecControlLoop(validate_profile_data(SPEC), **args)
    assert state.read_text() == text


def test_counters_of_another_version_only_restart_the_window(tmp_path: Path) -> None:
    # the counters are the window's start, not worth an error: the timers and fatal servers still load
    state = tmp_path / "s.json"
    state.write_text(json.dumps({**GOOD, "counters": {"ttft_sum": 1.0, "ttft_count": 2, "itl_p99": 3.0}}))
    loop = PdControlLoop(validate_profile_data(PD), router_url="http://127.0.0.1:1", mode="advise", state_path=state)
    loop._load_state()
    assert (loop.state.fatal, loop.state.last_switch_at, loop.prev) == (["http://10.0.0.11:30000"], 100.0, None)


def test_a_state_that_cannot_be_written_is_an_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # a read-only filesystem, as root cannot make one here: the write itself fails as it would there
    import errno

    from infer_ctl.launch import control_loop

    def read_only(*_a: object, **_k: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    path, state = tmp_path / "p.yaml", tmp_path / "s.json"
    path.write_text(yaml.safe_dump(PD))
    state.write_text(json.dumps(GOOD))
    monkeypatch.setattr(control_loop, "write_atomic", read_only)
    assert main(["pd", "clear-fatal", "-p", str(path), "--all-fatal", "--state", str(state)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the controller state file {state}: Read-only file system" in err
    assert "internal error" not in err
