"""The controllers' default state file (no --state) is one per cluster: the profile's name and a short hash
of the router's URL. It was the profile's name alone, so two clusters whose profiles share a name (`prod`
copied for a second site) shared one state and lock: each controller read the other's `fatal` servers and
cool-down, and while one was in its round the other's was skipped. The file an older version kept
(`pd-control-<name>.json`) is read while the new one is absent, so an upgrade keeps the fatal marks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.launch import pd_control, spec_control
from infer_ctl.launch.control_loop import router_key
from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.profile.load import validate_profile_data
from tests.launch.test_pd_control_cli import PROFILE as PD
from tests.launch.test_spec_control_lock import PROFILE as SPEC

FATAL = {"state": {"fatal": ["http://10.0.0.21:30000"], "last_switch_at": 100.0}, "counters": None}


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "inferctl"


def _profile(tmp_path: Path, name: str, listen: str, base: dict[str, Any] = PD) -> Path:
    path = tmp_path / f"{name}-{listen.replace(':', '_')}.yaml"
    path.write_text(yaml.safe_dump({**base, "router": {"listen": listen}}))
    return path


def test_the_router_url_names_the_cluster_however_it_is_typed() -> None:
    same = ["http://10.0.0.5:8177", "10.0.0.5:8177", "HTTP://10.0.0.5:8177/", " http://10.0.0.5:8177 "]
    assert len({router_key(u) for u in same}) == 1
    assert router_key("http://10.0.0.6:8177") != router_key("http://10.0.0.5:8177")
    assert router_key("http://10.0.0.5:8178") != router_key("http://10.0.0.5:8177")
    # the scheme's own port is no port, and an IPv6 address is one address however it is spelled: `pd
    # clear-fatal --url http://router:80` found another file than `pd control --url http://router` had kept
    assert router_key("http://router") == router_key("http://router:80") == router_key("HTTP://ROUTER:80/")
    assert router_key("https://router") == router_key("https://router:443") != router_key("http://router")
    assert router_key("http://router:443") != router_key("http://router")
    assert router_key("http://[::1]:8177") == router_key("http://[0:0:0:0:0:0:0:1]:8177/") == router_key("[::1]:8177")
    assert router_key("http://[::1]:8177") != router_key("http://[::2]:8177")
    # a URL already in its one spelling keeps the name it had (a state file kept under it is still found)
    assert router_key("http://10.0.0.5:8177") == "f68306b626"


@pytest.mark.parametrize("module", [pd_control, spec_control])
def test_two_clusters_of_one_profile_name_have_two_state_files(module: Any, state_home: Path) -> None:
    a = validate_profile_data({**SPEC, "router": {"listen": "10.0.0.5:8177"}})
    b = validate_profile_data({**SPEC, "router": {"listen": "10.1.0.5:8177"}})
    pa, pb = module.default_state_path(a, "http://10.0.0.5:8177"), module.default_state_path(b, "http://10.1.0.5:8177")
    assert pa != pb and pa.parent == pb.parent == state_home
    assert pa.name.startswith(("pd-control-lock-", "spec-control-lock-")) and pa.suffix == ".json"
    assert module.default_state_path(a, "10.0.0.5:8177/") == pa  # stable: the same router, the same file


def test_two_clusters_do_not_share_fatal_servers_or_the_lock(tmp_path: Path, state_home: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # the first cluster's controller marked a server fatal; the second cluster's profile has the same name
    first, second = _profile(tmp_path, "a", "127.0.0.1:1"), _profile(tmp_path, "b", "127.0.0.1:2")
    prof = validate_profile_data(yaml.safe_load(first.read_text()))
    mine = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise",
                         state_path=pd_control.default_state_path(prof, "http://127.0.0.1:1"))
    mine.state.fatal = ["http://10.0.0.21:30000"]
    mine._save_state()
    assert main(["pd", "clear-fatal", "-p", str(second), "--all-fatal", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cleared"] == []  # it was never the second cluster's
    with mine._exclusive() as held:  # the first cluster's round holds its lock: the second's runs
        assert held
        assert main(["pd", "control", "-p", str(second), "--once", "--json"]) == 3
        got = capsys.readouterr()
        assert "not reachable" in got.err  # it ran (nobody listens at :2), not skipped for the lock
    assert main(["pd", "clear-fatal", "-p", str(first), "--all-fatal", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cleared"] == ["http://10.0.0.21:30000"]


def test_clear_fatal_with_the_url_the_controller_was_given(tmp_path: Path, state_home: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = _profile(tmp_path, "a", "127.0.0.1:1")
    prof = validate_profile_data(yaml.safe_load(path.read_text()))
    loop = PdControlLoop(prof, router_url="http://10.9.9.9:8177", mode="advise",
                         state_path=pd_control.default_state_path(prof, "http://10.9.9.9:8177"))
    loop.state.fatal = ["http://10.0.0.21:30000"]
    loop._save_state()
    assert main(["pd", "clear-fatal", "-p", str(path), "--url", "10.9.9.9:8177", "--all-fatal", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cleared"] == ["http://10.0.0.21:30000"]


def test_the_old_state_file_is_read_until_the_new_one_exists(tmp_path: Path, state_home: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _profile(tmp_path, "a", "127.0.0.1:1")
    prof = validate_profile_data(yaml.safe_load(path.read_text()))
    state_home.mkdir(parents=True)
    old = state_home / f"pd-control-{prof.name}.json"
    old.write_text(json.dumps(FATAL))
    new = pd_control.default_state_path(prof, "http://127.0.0.1:1")
    said: list[str] = []
    loop = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=new,
                         legacy_state=pd_control.legacy_state_path(prof), say=said.append)
    loop._load_state()
    assert loop.state.fatal == ["http://10.0.0.21:30000"] and loop.state.last_switch_at == 100.0
    assert len(said) == 1 and str(old) in said[0] and str(new) in said[0]
    loop._save_state()
    assert json.loads(new.read_text())["state"]["fatal"] == ["http://10.0.0.21:30000"]
    assert json.loads(old.read_text()) == FATAL  # left as it is: another cluster of this name reads its own
    old.write_text(json.dumps({"state": {"fatal": ["http://elsewhere:1"]}}))
    loop._load_state()
    assert loop.state.fatal == ["http://10.0.0.21:30000"]  # the new file, once there, is the state
    # the command: clear-fatal of the profile's router reads the old file through the new name
    new.unlink()
    old.write_text(json.dumps(FATAL))
    assert main(["pd", "clear-fatal", "-p", str(path), "--all-fatal", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cleared"] == ["http://10.0.0.21:30000"]
    assert json.loads(new.read_text())["state"]["fatal"] == []


def test_spec_control_carries_the_old_cool_down_over(tmp_path: Path, state_home: Path) -> None:
    prof = validate_profile_data(SPEC)
    state_home.mkdir(parents=True)
    (state_home / f"spec-control-{prof.name}.json").write_text(json.dumps({"last_change_at": 1234.0, "pools": {}}))
    loop = spec_control.SpecControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise",
                                        state_path=spec_control.default_state_path(prof, "http://127.0.0.1:1"),
                                        legacy_state=spec_control.legacy_state_path(prof))
    assert loop.controller.last_change_at == 1234.0


def test_an_explicit_state_reads_no_old_file(tmp_path: Path, state_home: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _profile(tmp_path, "a", "127.0.0.1:1")
    prof = validate_profile_data(yaml.safe_load(path.read_text()))
    state_home.mkdir(parents=True)
    (state_home / f"pd-control-{prof.name}.json").write_text(json.dumps(FATAL))
    explicit = tmp_path / "mine.json"
    assert main(["pd", "clear-fatal", "-p", str(path), "--state", str(explicit), "--all-fatal", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cleared"] == []
    assert json.loads(explicit.read_text())["state"]["fatal"] == []
