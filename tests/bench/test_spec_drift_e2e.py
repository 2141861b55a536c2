"""`inferctl demo --scenario spec-drift`: simulated 2P+2D cluster (the builtin:local profile) behind the
real router, closed-loop non-streaming traffic whose domain shifts from code to creative writing; dc-02's
code-tuned draft drops to alpha ~0.30 (below the break-even of 3 steps at c 0.2), dc-01's general one
stays ~0.75. With control act only dc-02 is relaunched (drained first, no request dropped) and its
throughput recovers; with advise the profile change and the command are printed; with off, only the
alert and the recommendation."""

from __future__ import annotations

import json
import time

import pytest

from infer_ctl.bench.spec_demo import SpecDemoOptions, run_spec_demo
from infer_ctl.cli.main import main
from infer_ctl.profile import load_profile


def test_act_relaunches_only_the_drifted_pool_drops_nothing_and_throughput_recovers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    started = time.monotonic()
    assert main(["demo", "--scenario", "spec-drift", "--json"]) == 0
    took = time.monotonic() - started
    doc = json.loads(capsys.readouterr().out)
    assert doc["scenario"] == "spec-drift" and doc["control"] == "act"
    by_pool = {pool: url for url, pool in doc["decodes"].items()}
    d1, d2 = by_pool["dc-01"], by_pool["dc-02"]
    p1, p2, p3 = doc["phases"]

    # alpha falls on the drifted pool only
    assert abs(p1["acceptance"][d1]["alpha"] - 0.88) < 0.05 and abs(p1["acceptance"][d2]["alpha"] - 0.88) < 0.05
    assert abs(p2["acceptance"][d1]["alpha"] - 0.75) < 0.05 and abs(p2["acceptance"][d2]["alpha"] - 0.30) < 0.05
    # the alert (check spec's judgement): dc-02 slower than no speculation, dc-01 fine
    status = {f["node"]: f for f in p2["findings"]}
    assert status["dc-01"]["status"] == "ok"
    assert status["dc-02"]["status"] == "fail" and "set num_steps 1" in status["dc-02"]["remedy"]
    # the controller: an alert, then one relaunch of dc-02 to the recommended gamma; nothing else
    acts = [(a["action"], a["pool"]) for a in doc["actions"]]
    assert acts == [("alert", "dc-02"), ("relaunch", "dc-02")], acts
    relaunch = doc["actions"][1]
    assert (relaunch["from_steps"], relaunch["num_steps"]) == (3, 1)
    assert relaunch["result"]["ok"] and relaunch["result"]["restarted"] == ["dc-02 (drained)"]
    assert "num_steps: 1" in relaunch["profile_change"] and relaunch["command"].endswith("--role decode --nodes dc-02")
    # only the drifted pool changed
    assert p3["acceptance"][d2]["num_steps"] == 1 and p3["acceptance"][d1]["num_steps"] == 3
    # no request dropped, during the relaunch or anywhere else
    assert doc["failed_during_change"] == 0 and doc["ok_during_change"] > 0 and doc["failed_total"] == 0
    # throughput after > before: the drifted decode's tokens per target-step time (counts, no wall clock)
    before, after = p2["step_throughput"][d2], p3["step_throughput"][d2]
    assert before < 1.0 < after and after / before > 1.15, (before, after)
    assert p3["step_throughput"][d1] == pytest.approx(p2["step_throughput"][d1], rel=0.1)
    assert took < 60, f"the demo should take seconds, took {took:.1f}"


def test_advise_prints_the_profile_change_and_the_command_and_changes_nothing() -> None:
    lines: list[str] = []
    o = run_spec_demo(load_profile("builtin:local"), SpecDemoOptions(control="advise", seed=3), log=lines.append)
    assert [a["action"] for a in o.actions] == ["alert", "advise"]
    advice = o.actions[1]
    assert advice["pool"] == "dc-02" and advice["num_steps"] == 1
    assert "speculative:\n  pools:\n    - name: dc-02\n      nodes: [dc-02]\n      num_steps: 1" in advice["profile_change"]
    assert advice["command"] == "inferctl launch -p builtin:local --rolling --role decode --nodes dc-02"
    assert any("apply with: inferctl launch" in line for line in lines)
    assert len(o.phases) == 2 and all(w["num_steps"] == 3 for w in o.phases[-1].acceptance.values())
    assert o.failed_total == 0


def test_off_alerts_through_the_judgement_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scenario", "spec-drift", "--control", "off"]) == 0
    out = capsys.readouterr().out
    assert "FAIL dc-02" in out and "slower than none" in out
    assert "controller" not in out
    assert main(["demo", "--scenario", "spec-drift", "--control", "sometimes"]) == 64
    assert main(["demo", "--scenario", "nope"]) == 64
