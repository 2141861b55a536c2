"""Profile contradictions that make a broken launch: each is a FAIL with the field to
change, from `profile validate` (exit 64) and `launch --dry-run` alike (core/sglang/contradictions.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.core.sglang.consistency import launch_problems
from infer_ctl.profile.load import validate_profile_data

SOUND_DECODE = ["--max-running-requests", "128"]


def _data(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t",
        "nodes": [
            {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
            {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]},
        ],
        "models": {"target": {"path": "/m", "tp": 8}},
    }
    data.update(over)
    return data


def _findings(data: dict[str, Any]) -> list[Any]:
    return [f for f in launch_problems(validate_profile_data(data)) if f.status.value != "ok"]


def _validate(tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code = main(["profile", "validate", "-p", str(path), "--json"])
    return code, json.loads(capsys.readouterr().out)


CASES = {
    "no models": (_data(models=None), "launch.models", "models.target.path"),
    "gpus 0 with tp 8": (
        _data(nodes=[{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                     {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 0}]),
        "launch.gpus", "nodes[1].gpus",
    ),
    "collocated with PD roles": (
        _data(collocated=True, nodes=[{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                                      {"name": "pf-02", "host": "10.0.0.12", "roles": ["prefill"]},
                                      {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}]),
        "launch.collocated", "collocated",
    ),
    "collocated with a decode section": (
        _data(collocated=True, nodes=[{"name": "box", "host": "10.0.0.11", "roles": ["prefill", "decode"]}],
              sglang={"decode": {"port": 31000}, "extra_args": {"decode": ["--page-size", "16"]}}),
        "launch.collocated", "sglang.extra_args.decode",
    ),
    "extra --tp-size over models.target.tp": (
        _data(sglang={"extra_args": {"decode": ["--tp-size", "4"]}}), "launch.override", "models.target.tp",
    ),
    "extra --port over the profile's port": (
        _data(sglang={"extra_args": {"prefill": ["--port", "31999"]}}), "launch.override",
        "nodes[0].overrides.prefill_port or sglang.prefill.port",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_contradiction_is_a_fail_with_field_and_remedy(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, check, field = CASES[case]
    hits = [f for f in _findings(data) if f.check == check and f.details.get("field") == field]
    assert hits, [(f.check, dict(f.details)) for f in _findings(data)]
    assert all(f.status.value == "fail" for f in hits)
    # the remedy names what to change
    assert all(f.remedy for f in hits)
    code, doc = _validate(tmp_path, data, capsys)
    assert code == 64
    assert any(f["check"] == check and f["details"].get("field") == field for f in doc["findings"])


def test_collocated_profile_with_both_roles_per_node_is_sound() -> None:
    """A collocated node listing prefill and decode (the shipped convention), or one role on a single
    node, is no contradiction."""
    for roles in (["prefill", "decode"], ["prefill"]):
        data = _data(collocated=True, nodes=[{"name": "box", "host": "10.0.0.11", "roles": roles}])
        assert not [f for f in _findings(data) if f.check == "launch.collocated"]


def test_gpus_0_is_fine_for_a_cpu_server() -> None:
    data = _data(nodes=[{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 0},
                        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 0}],
                 models={"target": {"path": "/m"}},
                 sglang={"extra_args": {"prefill": ["--device", "cpu"], "decode": ["--device", "cpu"]}})
    assert not [f for f in _findings(data) if f.check == "launch.gpus"]


def test_a_harmless_override_stays_a_warning_and_validate_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _data(models={"target": {"path": "/m", "tp": 8, "context_length": 8192}},
                 sglang={"extra_args": {"prefill": ["--context-length", "4096"]}})
    (hit,) = [f for f in _findings(data) if f.check == "launch.override"]
    assert hit.status.value == "warn" and hit.details["field"] == "models.target.context_length"
    code, doc = _validate(tmp_path, data, capsys)
    assert code == 1
    assert [f["details"]["field"] for f in doc["findings"] if f["check"] == "launch.override"] == [
        "models.target.context_length"
    ]


def test_dry_run_refuses_a_profile_without_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_data(models=None)))
    code = main(["launch", "--dry-run", "-p", str(path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2
    assert [f["check"] for f in doc["findings"] if f["status"] == "fail"] == ["launch.models"]


def test_one_smaller_node_is_a_warning_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one 4-GPU prefill node among 8-GPU ones: every tp-8 prefill server silently spanned two nodes
    nodes = [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 4},
             {"name": "pf-02", "host": "10.0.0.12", "roles": ["prefill"]},
             {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}]
    data = _data(nodes=nodes, sglang={"extra_args": {"decode": SOUND_DECODE}})
    (f,) = [f for f in _findings(data) if f.check == "launch.gpus_uneven"]
    assert f.status.value == "warn" and f.details["field"] == "nodes[0].gpus" and f.details["nnodes"] == 2
    assert "spans 2 nodes" in f.message and "4 GPUs idle" in f.message and f.remedy
    code, doc = _validate(tmp_path, data, capsys)
    assert code == 1 and "launch.gpus_uneven" in {x["check"] for x in doc["findings"]}
    # uneven counts that change nothing (each node holds a whole server) say nothing
    small_tp = _data(nodes=nodes, models={"target": {"path": "/m", "tp": 4}}, sglang={"extra_args": {"decode": SOUND_DECODE}})
    assert not [f for f in _findings(small_tp) if f.check == "launch.gpus_uneven"]
