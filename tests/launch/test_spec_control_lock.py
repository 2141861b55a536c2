"""Two `inferctl spec control` processes on one profile (cron overlapping a unit, or a round that outlasts
the interval: a relaunch takes minutes): one pool change, not two concurrent rolling relaunches of the same
pool, and the cool-down the first recorded is honoured by the second; a round skipped because another
controller holds the lock: exit 3, said (who holds it)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.core.spec.controller import PoolChange, PoolObservation
from infer_ctl.core.spec.pools import Pool
from infer_ctl.launch.spec_control import ActionResult, SpecControlLoop
from infer_ctl.profile.load import validate_profile_data
from tests.launch.locked_round import assert_skipped

PROFILE: dict[str, Any] = {
    "name": "lock",
    "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
              {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
    "models": {"target": {"path": "/m/t", "tp": 8},
               "draft": {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                         "num_draft_tokens": 4}},
    "router": {"listen": "127.0.0.1:1"},
    "speculative": {"control": "act", "window_requests": 40, "min_requests": 20, "sustain_s": 0, "cooldown_s": 900},
}


class _Loop(SpecControlLoop):
    """The real loop, its router answers replaced: dc-01's pool far below the threshold."""

    def observe(self) -> list[PoolObservation]:
        return [PoolObservation("dc-01", 0.3, 40, 3)]

    def _post(self, rec: dict[str, Any]) -> dict[str, Any]:
        return rec


class _SlowRelaunch:
    def __init__(self, log: Path) -> None:
        self.log = log

    def apply(self, pool: Pool, change: PoolChange) -> ActionResult:
        with self.log.open("a") as f:
            f.write(f"start {pool.name}\n")
        time.sleep(1.5)
        with self.log.open("a") as f:
            f.write(f"end {pool.name}\n")
        return ActionResult(True, "relaunched")


def _one_round(state: str, log: str) -> None:
    prof = validate_profile_data(PROFILE)
    loop = _Loop(prof, router_url="http://127.0.0.1:1", mode="act", actuator=_SlowRelaunch(Path(log)),
                 state_path=state)
    loop.tick()


def test_two_concurrent_controllers_change_the_pool_once(tmp_path: Path) -> None:
    state, log = str(tmp_path / "state.json"), str(tmp_path / "relaunches.log")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_one_round, args=(state, log)) for _ in range(2)]
    for p in procs:
        p.start()
        time.sleep(0.3)  # the second starts while the first relaunches
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert Path(log).read_text().splitlines() == ["start dc-01", "end dc-01"]
    # and a third, after both: within the cool-down the first recorded, nothing either
    _one_round(state, log)
    assert Path(log).read_text().count("start") == 1


@pytest.mark.parametrize("json_out", [True, False])
def test_a_round_skipped_for_the_lock_says_so_and_exits_3(json_out: bool, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # it was skipped silently: exit 0 and nothing in --json, as if the round had found nothing to do
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({**PROFILE, "speculative": {**PROFILE["speculative"], "control": "advise"}}))
    state = tmp_path / "s.json"
    holder = SpecControlLoop(validate_profile_data(PROFILE), router_url="http://127.0.0.1:1", mode="advise",
                             state_path=state)
    with holder._exclusive() as mine:
        assert mine
        # the router is absent: a round that ran would exit 3 "not reachable"; a skipped one asks nothing
        code = main(["spec", "control", "-p", str(path), "--once", "--state", str(state)]
                    + (["--json"] if json_out else []))
    doc = assert_skipped(code, capsys, state, json_out)
    if json_out:
        assert doc["pools"] == []  # no pool was looked at


def test_a_round_that_ran_reports_no_skip(tmp_path: Path) -> None:
    loop = _Loop(validate_profile_data(PROFILE), router_url="http://127.0.0.1:1", mode="advise",
                 state_path=tmp_path / "s.json")
    loop.tick()
    assert (loop.rounds_run, loop.rounds_skipped, loop.last_skip) == (1, 0, None)
    other = _Loop(validate_profile_data(PROFILE), router_url="http://127.0.0.1:1", mode="advise",
                  state_path=tmp_path / "s.json")
    with loop._exclusive():
        assert other.tick() == []
    assert (other.rounds_run, other.rounds_skipped) == (0, 1)
    assert other.last_skip is not None and other.last_skip["holder"]["pid"] == os.getpid()


def test_a_released_lock_names_no_holder(tmp_path: Path) -> None:
    loop = SpecControlLoop(validate_profile_data(PROFILE), router_url="http://127.0.0.1:1", mode="advise",
                           state_path=tmp_path / "s.json")
    with loop._exclusive() as mine:
        assert mine
        held = loop._holder()
        assert held is not None and held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    assert loop._holder() is None
