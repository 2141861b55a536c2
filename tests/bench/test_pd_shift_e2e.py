"""`inferctl demo --scenario pd-shift`: the mix shifts to long outputs on 2P+2D with role
switching, the controller moves a prefill to the decode pool, nothing fails. Timings are not asserted here
(2 shared cores); docs/benchmarks.md has the measured ones."""

from __future__ import annotations

import json

import pytest

from infer_ctl.cli.main import main


def test_pd_shift_demo_moves_a_prefill_to_the_decode_pool_and_fails_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["demo", "--scenario", "pd-shift", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    data = doc.get("data", doc)
    assert data["failed"] == 0
    assert [a["to_role"] for a in data["actions"] if a["action"] == "switch"] == ["decode"]
    assert sorted(data["roles_after"].values()).count("decode") == 3
    assert data["phase2_after_switch"]["requests"] > 0
