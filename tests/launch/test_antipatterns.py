"""The seed's anti-patterns: each a WARN with a field path and a remedy from `profile validate`
(exit 1) and `launch --dry-run` (core/sglang/antipatterns.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.core.sglang.consistency import launch_problems
from infer_ctl.core.sizing.spec import break_even_alpha, speedup
from infer_ctl.profile.load import validate_profile_data

DECODE = ["--max-running-requests", "128"]
DRAFT = {"path": "/d", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


def _data(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t",
        "nodes": [
            {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "rdma": {"devices": ["mlx5_0", "mlx5_1"]}},
            {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "rdma": {"devices": ["mlx5_0", "mlx5_1"]}},
        ],
        "models": {"target": {"path": "/m", "tp": 8, "preset": "llama-3.1-70b"}, "draft": dict(DRAFT)},
        "sglang": {"extra_args": {"decode": list(DECODE)}},
    }
    data.update(over)
    return data


def _hits(data: dict[str, Any], check: str) -> list[Any]:
    return [f for f in launch_problems(validate_profile_data(data)) if f.check == check]


STORAGE = {"hicache": {"roles": ["prefill"], "storage": {"backend": "mooncake"}},
           "extra_args": {"prefill": ["--page-size", "64"], "decode": [*DECODE, "--page-size", "64"]}}
CASES = {
    "cost ratio above 0.10": (_data(speculative={"cost_ratio": 0.2}), "launch.draft_size", "speculative.cost_ratio"),
    "draft preset a ninth of the target": (
        _data(models={"target": {"path": "/m", "tp": 8, "preset": "llama-3.1-70b"},
                      "draft": {**DRAFT, "algorithm": "STANDALONE", "preset": "llama-3.1-8b"}}),
        "launch.draft_size", "models.draft.preset",
    ),
    "unchunked prefill on a 128k model": (
        _data(sglang={"extra_args": {"prefill": ["--chunked-prefill-size", "-1"], "decode": DECODE}}),
        "launch.chunked_prefill", "sglang.extra_args.prefill",
    ),
    "chunk above the context": (
        _data(models={"target": {"path": "/m", "tp": 8, "context_length": 65536}},
              sglang={"extra_args": {"prefill": ["--chunked-prefill-size", "131072"], "decode": DECODE}}),
        "launch.chunked_prefill", "sglang.extra_args.prefill",
    ),
    "gamma 6": (
        _data(models={"target": {"path": "/m", "tp": 8},
                      "draft": {**DRAFT, "num_steps": 6, "num_draft_tokens": 7}}),
        "launch.spec_lookahead", "models.draft.num_steps",
    ),
    "storage on the KV NICs": (_data(sglang=STORAGE), "launch.kv_storage_nic", "sglang.hicache.storage"),
    # SGLang's scheduler disables chunking for any size <= 0, not only -1
    "chunk size 0": (
        _data(sglang={"extra_args": {"prefill": ["--chunked-prefill-size=0"], "decode": DECODE}}),
        "launch.chunked_prefill", "sglang.extra_args.prefill",
    ),
    # the field named is the one that gave the flag: a node's overrides, or the role's extra args
    "unchunked by a node override": (
        _data(nodes=[{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"],
                      "overrides": {"extra_args": ["--chunked-prefill-size", "-1"]}},
                     {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}]),
        "launch.chunked_prefill", "nodes[0].overrides.extra_args",
    ),
    "gamma 7 from the decode's extra args": (
        _data(sglang={"extra_args": {"prefill": ["--speculative-num-steps", "7"],
                                     "decode": [*DECODE, "--speculative-num-steps", "7"]}}),
        "launch.spec_lookahead", "sglang.extra_args.decode",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_antipattern_is_a_warning_with_field_and_remedy(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, check, field = CASES[case]
    hits = _hits(data, check)
    assert hits and {f.details["field"] for f in hits} == {field}
    assert all(f.status.value == "warn" and f.remedy for f in hits)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    code = main(["profile", "validate", "-p", str(path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and check in {f["check"] for f in doc["findings"]}, doc["findings"]
    code = main(["launch", "--dry-run", "-p", str(path), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert check in {f["check"] for f in doc["findings"]}


def test_draft_size_shows_break_even_and_speedup() -> None:
    (f,) = _hits(_data(speculative={"cost_ratio": 0.2}), "launch.draft_size")
    be = break_even_alpha(3, 0.2)
    assert be is not None and f.details["break_even_alpha"] == be
    assert f.details["speedup_at_assumed_alpha"] == round(speedup(0.7, 3, 0.2), 3)
    assert f"break-even alpha {be:.2f}" in f.message and f"{speedup(0.7, 3, 0.2):.2f}x" in f.message


@pytest.mark.parametrize(
    "data",
    [
        _data(),  # a small EAGLE3 head, SGLang's default chunking, gamma 3, no storage tier
        _data(speculative={"cost_ratio": 0.05}),
        _data(sglang={"extra_args": {"prefill": ["--chunked-prefill-size", "-1"], "decode": DECODE}},
              models={"target": {"path": "/m", "tp": 8, "context_length": 8192}}),  # short context
        _data(sglang={**STORAGE, "hicache": {"roles": ["prefill"], "storage": {
            "backend": "mooncake", "extra_config": {"device_name": "mlx5_4"}}}}),  # storage NIC of its own
        _data(sglang={**STORAGE, "hicache": {"roles": ["prefill"], "storage": {"backend": "file"}}}),
    ],
)  # fmt: skip
def test_sound_settings_say_nothing(data: dict[str, Any]) -> None:
    checks = ("launch.draft_size", "launch.chunked_prefill", "launch.spec_lookahead", "launch.kv_storage_nic")
    assert [f.message for f in launch_problems(validate_profile_data(data)) if f.check in checks] == []


def test_shipped_profiles_have_none() -> None:
    from infer_ctl.profile import load_profile
    from infer_ctl.resources import builtin_profile_names

    checks = ("launch.draft_size", "launch.chunked_prefill", "launch.spec_lookahead", "launch.kv_storage_nic")
    for name in builtin_profile_names():
        assert [f.message for f in launch_problems(load_profile(f"builtin:{name}")) if f.check in checks] == []


def test_pd_disagreement_names_the_extra_args_that_set_the_flag() -> None:
    # it had no field path: which of the many extra-args lists to change was left to the reader
    data = _data(nodes=[
        {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "overrides": {"extra_args": ["--page-size", "16"]}},
    ])
    (f,) = _hits(data, "launch.pd_agreement")
    assert f.details["field"] == "nodes[1].overrides.extra_args" and "nodes[1].overrides.extra_args" in (f.remedy or "")
    only_prefill = _data(sglang={"extra_args": {"prefill": ["--page-size", "32"], "decode": DECODE}})
    assert {f.details["field"] for f in _hits(only_prefill, "launch.pd_agreement")} == {"sglang.extra_args.prefill"}


@pytest.mark.parametrize("extra", [
    ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d"],  # the numbers unset
    ["--speculative-algorithm", "NGRAM"],  # SGLang refuses any algorithm with the role switch
    ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/d", "--speculative-num-steps", "3",
     "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "8"],  # with a numbers warning beside
])
def test_role_switch_with_speculative_extra_args_fails(extra: list[str]) -> None:
    # models.draft unset, so the profile's own rule cannot see the draft: the launch check must
    data = _data(models={"target": {"path": "/m", "tp": 8}},
                 sglang={"pd_role_switch": True, "extra_args": {"prefill": extra, "decode": [*DECODE, *extra]}})
    fails = [f for f in _hits(data, "launch.spec") if f.status.value == "fail"]
    assert len(fails) == 2 and all("--enable-pd-role-switch cannot be combined" in f.message for f in fails)
