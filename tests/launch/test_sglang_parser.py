"""Every rendered command line of every shipped profile is accepted by SGLang 0.5.23's own parser.

Real part: `sglang.srt.server_args.ServerArgs` from the `sglang` extra (installed by .ci/run without
GPU dependencies). Skipped, with the reason, where SGLang is not importable.
"""

from __future__ import annotations

import pytest

from infer_ctl.core.sglang import server_args
from infer_ctl.launch.argcheck import ArgParseFailure, check_instances, parse_with_sglang, sglang_available
from infer_ctl.launch.render import instances, render_argv
from infer_ctl.profile import load_profile
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.resources import builtin_profile_names

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(
        not sglang_available(), reason="sglang not importable: pip install 'inferctl[sglang]'"
    ),
]


@pytest.mark.parametrize("name", builtin_profile_names())
def test_every_instance_of_shipped_profile_parses(name: str) -> None:
    profile = load_profile(f"builtin:{name}")
    for inst in instances(profile):
        argv = render_argv(profile, inst)
        parsed = parse_with_sglang(server_args(argv))
        # what SGLang read is what the profile says
        assert parsed.port == inst.port
        assert parsed.host == inst.bind_host
        assert parsed.tp_size == inst.tp and parsed.dp_size == inst.dp
        if profile.models:
            assert parsed.model_path == profile.models.target.path
        if profile.models and profile.models.draft:
            draft = profile.models.draft
            assert parsed.speculative_algorithm == draft.algorithm.value
            assert parsed.speculative_num_steps == draft.num_steps
            assert parsed.speculative_eagle_topk == draft.eagle_topk
            assert parsed.speculative_num_draft_tokens == draft.num_draft_tokens
        expected_mode = inst.role if inst.role != "collocated" else "null"
        assert parsed.disaggregation_mode == expected_mode
        if inst.role == "prefill":
            assert parsed.disaggregation_bootstrap_port == inst.bootstrap_port


def test_multinode_device_map_and_kv_events_parse() -> None:
    profile = validate_profile_data(
        {
            "name": "wide",
            "nodes": [
                {"name": f"pf-0{i}", "host": f"10.0.0.1{i}", "roles": ["prefill"], "gpus": 8,
                 "rdma": {"device_map": {str(g): f"mlx5_{g // 2}" for g in range(8)}}}
                for i in (1, 2)
            ] + [{"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8}],
            "models": {"target": {"path": "/m", "tp": 16},
                       "draft": {"algorithm": "NGRAM"}},
            "sglang": {"decode": {"tp": 8}, "kv_events": {"publisher": "zmq"},
                       "extra_args": {"decode": ["--cuda-graph-max-bs-decode", "64"]}},
            "router": {"prefixes": [{"name": "p", "text": "x", "pin": True}]},
        }
    )  # fmt: skip
    results = check_instances([(i, render_argv(profile, i)) for i in instances(profile)])
    assert [r.ok for r in results] == [True, True, True], results
    parsed = parse_with_sglang(server_args(render_argv(profile, instances(profile)[1])))
    assert (parsed.nnodes, parsed.node_rank, parsed.dist_init_addr) == (2, 1, "10.0.0.11:25000")
    assert parsed.radix_eviction_policy == "priority"


def test_sglang_rejects_a_flag_that_does_not_exist_in_0_5_23() -> None:
    # `--cuda-graph-max-bs` was split into -decode/-prefill; argparse finds the prefix ambiguous
    with pytest.raises(ArgParseFailure, match="ambiguous option: --cuda-graph-max-bs"):
        parse_with_sglang(["--model-path", "/m", "--cuda-graph-max-bs", "64"])
    with pytest.raises(ArgParseFailure, match="invalid choice"):
        parse_with_sglang(["--model-path", "/m", "--disaggregation-mode", "prefil"])


def _pd(**sglang: object) -> object:
    return validate_profile_data({
        "name": "hooks",
        "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8,
                   "rdma": {"devices": ["mlx5_0", "mlx5_1"], "gid_index": 3}},
                  {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8,
                   "rdma": {"device_map": {str(g): f"mlx5_{g // 4}" for g in range(8)}, "gid_index": 3}}],
        "models": {"target": {"path": "/m", "tp": 8}},
        "sglang": sglang,
    })  # fmt: skip


def test_shipped_profiles_pass_sglangs_model_free_resolution_hooks() -> None:
    profile = load_profile("builtin:reference-h100-h200")
    results = check_instances([(i, render_argv(profile, i)) for i in instances(profile)])
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert results[0].hooks == ["handle_hicache_ratio_default", "handle_pd_disaggregation", "parse_ib_device_config",
                                "speculative algorithm lookup", "handle_hicache", "handle_cache_compatibility (HiCache rules)"]
    assert all(not r.rewrites for r in results)  # the prefills run HiCache; nothing of it is rewritten
    decode = next(r for r in results if r.instance.endswith("-decode"))
    assert decode.hooks == ["handle_pd_disaggregation", "parse_ib_device_config", "speculative algorithm lookup"]


@pytest.mark.parametrize(("extra", "fragment"), [
    # argparse accepts both; SGLang's handle_pd_disaggregation refuses them when resolving
    (["--disaggregation-decode-host-receive-threshold", "1.5"],
     "handle_pd_disaggregation: ValueError: --disaggregation-decode-host-receive-threshold must be between 0 and 1"),
    (["--disaggregation-decode-host-receive-threshold", "0.5", "--enable-pd-role-switch"],
     "Decode host receive does not yet support HiSparse or role switching"),
    (["--disaggregation-decode-host-receive-threshold", "0.5", "--disaggregation-decode-retraction-backup", "cpu_tensor"],
     "Decode host KV buffering requires host_pool retraction"),
    # SGLang's IB device parser on the rendered value: a map key that is not a GPU id
    (["--disaggregation-ib-device", '{"gpu0":"mlx5_0"}'], "parse_ib_device_config: ValueError: Invalid format: keys must be integers"),
])  # fmt: skip
def test_check_args_runs_sglangs_pd_and_ib_device_hooks(extra: list[str], fragment: str) -> None:
    profile = _pd(extra_args={"decode": extra})
    results = {r.instance: r for r in check_instances([(i, render_argv(profile, i)) for i in instances(profile)])}
    assert results["pf-01-prefill"].ok
    bad = results["dc-01-decode"]
    assert not bad.ok and bad.error is not None and fragment in bad.error, bad


def test_mooncake_tcp_resolution_does_not_leak_into_this_process_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    profile = _pd(transfer_backend="mooncake_tcp")
    results = check_instances([(i, render_argv(profile, i)) for i in instances(profile)])
    assert all(r.ok for r in results) and "MC_FORCE_TCP" not in os.environ
    # the device is cleared for TCP, so SGLang's IB parser has nothing to read
    assert results[0].hooks == ["handle_pd_disaggregation"]


def test_check_args_with_another_sglang_version_is_unknown_not_accepted(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    import json
    from pathlib import Path

    from infer_ctl.cli.main import main

    path = Path(str(tmp_path)) / "old.yaml"
    path.write_text(
        "name: old\nnodes:\n  - {name: pf-01, host: 10.9.9.1, roles: [prefill]}\n"
        "  - {name: dc-01, host: 10.9.9.2, roles: [decode]}\nmodels: {target: {path: /m}}\n"
        "sglang: {version: 0.5.21}\n"
    )
    assert main(["launch", "-p", str(path), "--check-args", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    found = [f for f in doc["findings"] if f["check"] == "launch.sglang_parser"]
    assert {f["status"] for f in found} == {"unknown"}
    assert "the SGLang here is 0.5.23, the profile runs 0.5.21" in found[0]["message"]
