"""The profile's `speculative:` section: bad input is one clear error naming the field (exit 64), pools
resolve, and a pool's own step count / adaptive mode renders on that pool's decodes only."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.core.sglang import build_argv, instances
from infer_ctl.core.sglang.consistency import launch_problems
from infer_ctl.core.spec.pools import pools, server_override
from infer_ctl.errors import ProfileError
from infer_ctl.profile.load import validate_profile_data

BASE: dict[str, Any] = {
    "name": "spec",
    "nodes": [
        {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]},
        {"name": "dc-02", "host": "10.0.0.22", "roles": ["decode"]},
        {"name": "dc-03", "host": "10.0.0.23", "roles": ["decode"]},
    ],
    "models": {"target": {"path": "/m/llama-70b", "tp": 8},
               "draft": {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                         "num_draft_tokens": 4}},
    "router": {"listen": "127.0.0.1:8000"},
}


def _with(**spec: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["speculative"] = spec
    return data


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ProfileError) as info:
        validate_profile_data(data)
    assert info.value.exit_code == 64
    return list(info.value.errors or [info.value.message])


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"alert_threshold": 1.5}, "speculative.alert_threshold"),
        ({"alert_threshold": 0}, "speculative.alert_threshold"),
        ({"min_steps": 5, "max_steps": 2}, "speculative.min_steps: min_steps 5 is above max_steps 2"),
        ({"pools": [{"name": "a", "nodes": ["dc-01"], "alert_threshold": -0.1}]},
         "speculative.pools[0].alert_threshold"),
        ({"pools": [{"name": "a", "nodes": ["dc-01"], "min_steps": 4, "max_steps": 2}]},
         "speculative.pools[0].min_steps"),
        ({"pools": [{"name": "a", "nodes": ["pf-01"]}]}, "speculative.pools[0].nodes[0]: 'pf-01': it runs no decode"),
        ({"pools": [{"name": "a", "nodes": ["dc-09"]}]}, "'dc-09': no such node"),
        ({"pools": [{"name": "a", "nodes": ["dc-01"]}, {"name": "b", "nodes": ["dc-01"]}]},
         "speculative.pools[1].nodes[0]: 'dc-01' is already in pool 'a'"),
        ({"pools": [{"name": "a", "nodes": ["dc-01"], "adaptive_steps": [1, 2]}]},
         "speculative.pools[0].adaptive_steps: the launch step count 3 is not a candidate [1, 2]"),
        ({"control": "sometimes"}, "speculative.control"),
        ({"contol": "act"}, "did you mean 'control'"),
    ],
)
def test_bad_speculative_settings_name_the_field(spec: dict[str, Any], fragment: str) -> None:
    errors = _errors(_with(**spec))
    assert any(fragment in e for e in errors), errors


def test_act_needs_a_router_section() -> None:
    data = _with(control="act")
    del data["router"]
    errors = _errors(data)
    assert any(e.startswith("speculative.control: act needs a router") for e in errors), errors
    data["speculative"]["control"] = "advise"  # advising needs none
    validate_profile_data(data)
    validate_profile_data(_with(control="act"))


def test_adaptive_needs_eagle_at_topk_1() -> None:
    data = _with(pools=[{"name": "a", "nodes": ["dc-01"], "adaptive_steps": [1, 3]}])
    data["models"]["draft"].update(eagle_topk=4, num_draft_tokens=8)
    errors = _errors(data)
    assert any("EAGLE/EAGLE3 with eagle_topk 1 only" in e for e in errors), errors


def test_cli_validate_exits_64_with_one_line_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_with(alert_threshold=2)))
    assert main(["profile", "validate", "-p", str(path)]) == 64
    out, err = capsys.readouterr()
    assert "speculative.alert_threshold" in out + err


def test_pools_default_to_one_per_decode_node() -> None:
    prof = validate_profile_data(_with(alert_threshold=0.6, pools=[
        {"name": "code", "nodes": ["dc-02", "dc-01"], "alert_threshold": 0.7, "cost_ratio": 0.2, "num_steps": 2}]))
    got = {p.name: p for p in pools(prof)}
    assert list(got) == ["code", "dc-03"]
    assert got["code"].nodes == ("dc-01", "dc-02") and got["code"].num_steps == 2
    assert got["code"].limits.alert_threshold == 0.7 and got["code"].limits.cost_ratio == 0.2
    assert got["dc-03"].limits.alert_threshold == 0.6 and got["dc-03"].limits.cost_ratio == 0.1
    assert got["dc-03"].num_steps == 3


def _args(prof: Any, name: str) -> list[str]:
    inst = next(i for i in instances(prof) if i.name == name)
    return build_argv(prof, inst).argv


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_a_pools_steps_render_on_its_decodes_only_and_are_not_a_pd_disagreement() -> None:
    prof = validate_profile_data(_with(pools=[{"name": "b", "nodes": ["dc-02"], "num_steps": 1}]))
    assert _flag(_args(prof, "dc-02-decode"), "--speculative-num-steps") == "1"
    assert _flag(_args(prof, "dc-02-decode"), "--speculative-num-draft-tokens") == "2"
    for other in ("pf-01-prefill", "dc-01-decode", "dc-03-decode"):
        assert _flag(_args(prof, other), "--speculative-num-steps") == "3", other
    assert [f for f in launch_problems(prof) if f.status.value == "fail" or f.check == "launch.pd_agreement"] == []


def test_an_adaptive_pool_renders_sglangs_flags_and_its_config_file() -> None:
    prof = validate_profile_data(_with(pools=[{"name": "b", "nodes": ["dc-02"], "num_steps": 2,
                                               "adaptive_steps": [0, 1, 2, 4]}]))
    argv = _args(prof, "dc-02-decode")
    assert "--speculative-adaptive" in argv
    path = _flag(argv, "--speculative-adaptive-config")
    assert path == "/etc/inferctl/sglang-decode.spec-adaptive.json"
    assert _flag(argv, "--speculative-num-steps") == "2" and _flag(argv, "--speculative-num-draft-tokens") == "3"
    over = server_override(prof, "dc-02", "decode", "/etc/inferctl")
    assert over is not None and over.adaptive_config is not None
    assert json.loads(over.adaptive_config[1]) == {"1": {"candidate_steps": [0, 1, 2, 4]}}
    assert "--speculative-adaptive" not in _args(prof, "dc-01-decode")
    assert "--speculative-adaptive" not in _args(prof, "pf-01-prefill")
    assert [f for f in launch_problems(prof) if f.status.value == "fail" or f.check == "launch.pd_agreement"] == []
