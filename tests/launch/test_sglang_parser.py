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
