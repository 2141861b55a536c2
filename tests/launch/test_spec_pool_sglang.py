"""A decode pool's own speculative settings as `launch --dry-run` renders them, judged by SGLang 0.5.23
itself (the `sglang` extra): its parser accepts --speculative-adaptive and its config path, and SGLang's
own adaptive code reads the candidates from the file launch deploys next to the env file and accepts the
launch step count as one of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sglang import instances, server_args
from infer_ctl.launch.argcheck import check_instances, parse_with_sglang, sglang_available
from infer_ctl.launch.deploy import rendered_files
from infer_ctl.launch.render import render_argv
from infer_ctl.profile.load import validate_profile_data

DATA = {
    "name": "pools",
    "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8},
              {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8},
              {"name": "dc-02", "host": "10.0.0.22", "roles": ["decode"], "gpus": 8}],
    "models": {"target": {"path": "/m/llama-70b", "tp": 8},
               "draft": {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                         "num_draft_tokens": 4}},
    "sglang": {"extra_args": {"decode": ["--max-running-requests", "128"]}},
    "speculative": {"pools": [{"name": "creative", "nodes": ["dc-02"], "num_steps": 1, "adaptive_steps": [0, 1, 2]},
                              {"name": "code", "nodes": ["dc-01"], "num_steps": 2}]},
}


def test_the_adaptive_pool_deploys_its_config_file_and_the_others_do_not() -> None:
    prof = validate_profile_data(DATA)
    files = {i.name: {f.path: f for f in rendered_files(prof, i, "systemd")} for i in instances(prof)}
    cfg = files["dc-02-decode"]["/etc/inferctl/sglang-decode.spec-adaptive.json"]
    assert json.loads(cfg.text) == {"1": {"candidate_steps": [0, 1, 2]}} and cfg.mode == 0o644
    assert not any(p.endswith(".spec-adaptive.json") for p in files["dc-01-decode"])
    assert not any(p.endswith(".spec-adaptive.json") for p in files["pf-01-prefill"])


def test_dry_run_json_shows_each_pools_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(DATA))
    assert main(["launch", "-p", str(path), "--dry-run", "--json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    argv = {r["instance"]: r["argv"] for r in doc["results"]}
    assert "--speculative-adaptive" in argv["dc-02-decode"]
    assert argv["dc-01-decode"][argv["dc-01-decode"].index("--speculative-num-steps") + 1] == "2"
    assert argv["pf-01-prefill"][argv["pf-01-prefill"].index("--speculative-num-steps") + 1] == "3"
    assert not [f for f in doc["findings"] if f["status"] == "fail"], doc["findings"]


@pytest.mark.sglang
@pytest.mark.skipif(not sglang_available(), reason="sglang not importable: pip install 'inferctl[sglang]'")
def test_sglang_0_5_23_accepts_the_rendered_adaptive_flags_and_reads_the_candidates(tmp_path: Path) -> None:
    from sglang.srt.speculative.adaptive_spec_params import resolve_candidate_steps_from_config

    prof = validate_profile_data(DATA)
    by_name = {i.name: i for i in instances(prof)}
    results = check_instances([(i, render_argv(prof, i)) for i in instances(prof)])
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    dc2 = by_name["dc-02-decode"]
    parsed = parse_with_sglang(server_args(render_argv(prof, dc2)))
    assert parsed.speculative_adaptive is True
    assert parsed.speculative_adaptive_config == "/etc/inferctl/sglang-decode.spec-adaptive.json"
    assert (parsed.speculative_num_steps, parsed.speculative_eagle_topk, parsed.speculative_num_draft_tokens) == (1, 1, 2)
    # SGLang reads the file launch deploys: the candidates, and the launch steps among them (else it refuses)
    [cfg] = [f for f in rendered_files(prof, dc2, "systemd") if f.path.endswith(".spec-adaptive.json")]
    local = tmp_path / "adaptive.json"
    local.write_text(cfg.text)
    cands = resolve_candidate_steps_from_config(cfg_path=str(local))
    assert cands == [0, 1, 2] and parsed.speculative_num_steps in cands
    dc1 = parse_with_sglang(server_args(render_argv(prof, by_name["dc-01-decode"])))
    assert (dc1.speculative_adaptive, dc1.speculative_num_steps, dc1.speculative_num_draft_tokens) == (False, 2, 3)
