"""Pre-launch consistency findings and the pure judging of live servers (no hosts needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.sglang import find_instance, render_argv
from infer_ctl.core.sglang.consistency import launch_problems
from infer_ctl.core.sglang.judge import expected_server_args, judge_drift, judge_loads, judge_pd_agreement
from infer_ctl.profile.load import validate_profile_data

#: a sound EAGLE decode sets --max-running-requests (else SGLang caps it at 48: launch.spec WARN)
SOUND_DECODE = ["--max-running-requests", "128"]


def _profile(**sglang: Any) -> Any:
    extra = dict(sglang.get("extra_args") or {})
    extra["decode"] = [*SOUND_DECODE, *extra.get("decode", [])]
    return _bare_profile(**{**sglang, "extra_args": extra})


def _bare_profile(**sglang: Any) -> Any:
    return validate_profile_data(
        {
            "name": "t",
            "nodes": [
                {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]},
            ],
            "models": {
                "target": {"path": "/m", "tp": 8},
                "draft": {
                    "path": "/d",
                    "algorithm": "EAGLE3",
                    "num_steps": 3,
                    "eagle_topk": 1,
                    "num_draft_tokens": 4,
                },
            },
            "sglang": sglang,
        }
    )


def _problems(**sglang: Any) -> dict[str, tuple[str, str]]:
    return {
        f"{f.check}:{f.subject}": (f.status.value, f.message) for f in launch_problems(_profile(**sglang))
    }


def test_sound_profile_has_no_problems() -> None:
    assert _problems() == {}


@pytest.mark.parametrize(
    ("extra", "key", "status", "fragment"),
    [
        ({"decode": ["--cuda-graph-max-bs", "64"]}, "launch.args:dc-01-decode", "fail",
         "ambiguous between --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"),
        ({"decode": ["--no-such-flag"]}, "launch.args:dc-01-decode", "fail", "SGLang 0.5.23 has no such flag"),
        ({"prefill": ["--radix-eviction-policy", "fifo"]}, "launch.args:pf-01-prefill", "fail", "not one of lru"),
        ({"decode": ["--speculative-num-draft-tokens", "6"]}, "launch.spec:dc-01-decode", "warn",
         "SGLang silently rewrites it to num_steps + 1 = 4"),
        ({"decode": ["--speculative-num-steps", "5"]}, "launch.pd_agreement:dc-01-decode", "fail",
         "--speculative-num-steps is 5 here but 3 on pf-01-prefill"),
        ({"prefill": ["--host", "127.0.0.1"]}, "launch.host:pf-01-prefill", "fail",
         "decodes on 10.0.0.21 cannot reach its bootstrap server"),
        # SGLang's decode raises "Page size mismatch" / "KV cache dtype mismatch" at the first transfer
        ({"decode": ["--page-size", "64"]}, "launch.pd_agreement:dc-01-decode", "fail",
         "--page-size is 64 here but None on pf-01-prefill"),
        ({"prefill": ["--page-size", "32"], "decode": ["--page-size", "64"]}, "launch.pd_agreement:dc-01-decode",
         "fail", "--page-size is 64 here but 32 on pf-01-prefill"),
        ({"decode": ["--kv-cache-dtype", "fp8_e4m3"]}, "launch.pd_agreement:dc-01-decode", "fail",
         "--kv-cache-dtype is fp8_e4m3 here but auto on pf-01-prefill"),
        ({"prefill": ["--kv-cache-dtype", "bf16"], "decode": ["--kv-cache-dtype", "bfloat16"]},
         "launch.pd_agreement:dc-01-decode", "fail", "--kv-cache-dtype is bfloat16 here but bf16"),
        # a server's role is the profile's, not an extra arg's
        ({"prefill": ["--disaggregation-mode", "decode"]}, "launch.role:pf-01-prefill", "fail",
         "extra args set --disaggregation-mode decode on a prefill server"),
        ({"decode": ["--disaggregation-mode", "null"]}, "launch.role:dc-01-decode", "fail",
         "set --disaggregation-mode null on a decode server (the profile makes it decode)"),
        # a bootstrap port only this server would know: refused for the profile's settings
        ({"prefill": ["--disaggregation-bootstrap-port", "9100"]}, "launch.bootstrap_port:pf-01-prefill",
         "fail", "extra args set --disaggregation-bootstrap-port 9100, but the profile gives 8998"),
        ({"decode": ["--disaggregation-bootstrap-port=9100"]}, "launch.bootstrap_port:dc-01-decode",
         "fail", "the router and the decodes use"),
    ],
)  # fmt: skip
def test_extra_args_problems(extra: dict, key: str, status: str, fragment: str) -> None:
    found = _problems(extra_args=extra)
    assert key in found, found
    assert found[key][0] == status and fragment in found[key][1]


def test_agreeing_page_size_and_kv_dtype_and_the_default_spelled_out_are_fine() -> None:
    assert _problems(extra_args={"prefill": ["--page-size", "64", "--kv-cache-dtype", "fp8_e4m3"],
                                 "decode": ["--page-size", "64", "--kv-cache-dtype", "fp8_e4m3"]}) == {}
    assert _problems(extra_args={"decode": ["--kv-cache-dtype", "auto"]}) == {}  # auto is the default
    assert _problems(extra_args={"prefill": ["--disaggregation-bootstrap-port", "8998"]}) == {}  # no change
    # SGLang parses the page size as an integer: 064 is page 64 (the dtype string is compared as given)
    assert _problems(extra_args={"prefill": ["--page-size", "64"], "decode": ["--page-size", "064"]}) == {}


def test_role_and_bootstrap_overrides_are_fails_not_override_warnings() -> None:
    found = _problems(extra_args={"prefill": ["--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "9"]})
    assert {k: v[0] for k, v in found.items()} == {
        "launch.role:pf-01-prefill": "fail", "launch.bootstrap_port:pf-01-prefill": "fail",
    }  # fmt: skip


def test_a_collocated_server_made_a_prefill_by_extra_args_fails() -> None:
    p = validate_profile_data({
        "name": "t", "collocated": True,
        "nodes": [{"name": "n-01", "host": "10.0.0.11", "roles": ["prefill", "decode"]}],
        "models": {"target": {"path": "/m"}},
        "sglang": {"extra_args": {"collocated": ["--disaggregation-mode", "prefill"]}},
    })  # fmt: skip
    (f,) = launch_problems(p)
    assert (f.check, f.status.value) == ("launch.role", "fail")
    assert "--disaggregation-mode prefill on a collocated server (the profile makes it null)" in f.message


def test_dry_run_and_check_args_fail_on_a_page_size_mismatch(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    bad = tmp_path / "pages.yaml"
    bad.write_text(
        "name: pages\nnodes:\n  - {name: pf-01, host: 10.9.9.1, roles: [prefill]}\n"
        "  - {name: dc-01, host: 10.9.9.2, roles: [decode]}\nmodels: {target: {path: /m}}\n"
        "sglang: {extra_args: {prefill: [--page-size, '1'], decode: [--page-size, '64']}}\n"
    )
    for mode in ("--dry-run", "--check-args"):
        assert main(["launch", "-p", str(bad), mode, "--json"]) == 2, mode
        doc = json.loads(capsys.readouterr().out)
        fails = [f["message"] for f in doc["findings"] if f["status"] == "fail"]
        assert "--page-size is 64 here but 1 on pf-01-prefill; prefill and decode must agree" in fails, doc


def test_drift_names_the_setting_and_normalises_aliases() -> None:
    p = _profile(transfer_backend="mooncake_tcp")
    inst = find_instance(p, "dc-01-decode")
    expected = expected_server_args(inst, render_argv(p, inst))
    info = {"model_path": "/m", "tp_size": 8, "dp_size": 1, "port": 30001, "disaggregation_mode": "decode",
            "disaggregation_transfer_backend": "mooncake", "speculative_algorithm": "EAGLE3",
            "speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
            "radix_eviction_policy": "lru", "unrelated": 1}  # fmt: skip
    assert [f.status.value for f in judge_drift(inst, expected, info)] == ["ok"]
    drifted = judge_drift(inst, expected, {**info, "tp_size": 4})
    assert [(f.status.value, f.message) for f in drifted] == [("fail", "tp_size is 4 but the profile says 8")]
    assert "inferctl launch --nodes dc-01" in (drifted[0].remedy or "")


def test_pd_agreement_and_stuck_queues() -> None:
    p = _profile()
    pre, dec = find_instance(p, "pf-01-prefill"), find_instance(p, "dc-01-decode")
    found = judge_pd_agreement({pre: {"model_path": "/m"}, dec: {"model_path": "/other"}})
    assert (
        found[0].status.value == "fail" and "model_path is /other here but /m on prefill" in found[0].message
    )
    stuck = {"loads": [{"dp_rank": 0, "num_waiting_reqs": 3, "num_running_reqs": 0, "gen_throughput": 0.0}]}
    assert judge_loads(dec, stuck)[0].status.value == "warn"
    busy = {"loads": [{"dp_rank": 0, "num_waiting_reqs": 3, "num_running_reqs": 2, "gen_throughput": 90.0}]}
    assert judge_loads(dec, busy)[0].status.value == "ok"


def test_cli_dry_run_json_and_launch_refuses_a_failing_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    assert (
        main(["launch", "-p", "builtin:reference-h100-h200", "--dry-run", "--json", "--role", "decode"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [r["instance"] for r in doc["results"]] == [f"dc-0{i}-decode" for i in range(1, 7)]
    assert doc["results"][0]["argv"][1:3] == ["-m", "sglang.launch_server"]
    assert "LimitMEMLOCK=infinity" in doc["results"][0]["unit"]["content"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\nnodes:\n  - {name: pf-01, host: 10.9.9.1, roles: [prefill]}\n"
        "  - {name: dc-01, host: 10.9.9.2, roles: [decode]}\nmodels: {target: {path: /m}}\n"
        "sglang: {extra_args: {decode: [--bogus-flag]}}\n"
    )
    # refused before any SSH connection (the hosts do not exist)
    assert main(["launch", "-p", str(bad), "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["launched"] is False and doc["findings"][0]["check"] == "launch.args"
    assert main(["launch", "-p", str(bad), "--role", "router"]) == 64
    assert main(["logs", "nope", "-p", str(bad)]) == 64


def test_profile_validate_fails_on_a_launch_plan_fail(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    bad = tmp_path / "dtype.yaml"
    bad.write_text(
        "name: dtype\nnodes:\n  - {name: pf-01, host: 10.9.9.1, roles: [prefill]}\n"
        "  - {name: dc-01, host: 10.9.9.2, roles: [decode]}\nmodels: {target: {path: /m}}\n"
        "sglang: {extra_args: {decode: [--kv-cache-dtype, fp8_e5m2]}}\n"
    )
    # a launch plan that would fail makes the profile invalid: exit 64, as a schema error
    assert main(["profile", "validate", "-p", str(bad), "--json"]) == 64
    doc = json.loads(capsys.readouterr().out)
    assert [(f["check"], f["status"]) for f in doc["findings"]] == [
        ("profile.schema", "ok"), ("launch.pd_agreement", "fail"), ("launch.kv_page", "skip")  # no model preset
    ]
    assert main(["profile", "validate", "-p", str(bad)]) == 64
    assert "--kv-cache-dtype is fp8_e5m2 here but auto on pf-01-prefill" in capsys.readouterr().out


def _spec(profile: Any) -> dict[str, tuple[str, str]]:
    return {f"{f.subject}": (f.status.value, f.message) for f in launch_problems(profile) if f.check == "launch.spec"}


def test_eagle_without_max_running_requests_warns_of_sglangs_silent_cap_of_48() -> None:
    found = _spec(_bare_profile())
    assert list(found) == ["dc-01-decode"]  # the decode's batch; the prefill is not warned
    assert found["dc-01-decode"][0] == "warn"
    assert "EAGLE3 without --max-running-requests: SGLang caps it at 48 running requests" in found["dc-01-decode"][1]
    assert _spec(_bare_profile(extra_args={"decode": ["--max-running-requests=256"]})) == {}
    # NGRAM is not resolved by SGLang's EAGLE handler: no cap
    ngram = validate_profile_data({"name": "t", "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
                                                          {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
                                   "models": {"target": {"path": "/m"}, "draft": {"algorithm": "NGRAM"}}})  # fmt: skip
    assert _spec(ngram) == {}


def _topk4(**extra: list[str]) -> Any:
    p = _profile(extra_args=extra)
    data = p.model_dump(mode="json", exclude_unset=True)
    data["models"]["draft"].update(num_steps=3, eagle_topk=4, num_draft_tokens=8)
    return validate_profile_data(data)


@pytest.mark.parametrize(("extra", "fragment"), [
    ({"prefill": ["--attention-backend", "trtllm_mha"]}, "--attention-backend trtllm_mha with eagle_topk 4: SGLang refuses it"),
    ({"decode": ["--decode-attention-backend", "trtllm_mha"]}, "--decode-attention-backend trtllm_mha with eagle_topk 4"),
    ({"prefill": ["--page-size", "64", "--attention-backend", "flashmla"],
      "decode": ["--page-size", "64", "--attention-backend", "flashmla"]},
     "eagle_topk 4 with --page-size 64 needs attention backend flashinfer, fa3, triton, not flashmla"),
])  # fmt: skip
def test_eagle_topk_above_one_backend_rules(extra: dict[str, list[str]], fragment: str) -> None:
    found = _spec(_topk4(**extra))
    assert any(status == "fail" and fragment in msg for status, msg in found.values()), found


@pytest.mark.parametrize("extra", [
    {"prefill": ["--page-size", "64", "--attention-backend", "fa3"], "decode": ["--page-size", "64", "--attention-backend", "fa3"]},
    {"prefill": ["--page-size", "64"], "decode": ["--page-size", "64"]},  # SGLang's default backend for topk > 1
    {"prefill": ["--attention-backend", "flashmla"], "decode": ["--attention-backend", "flashmla"]},  # page size 1
])  # fmt: skip
def test_eagle_topk_above_one_accepted_combinations(extra: dict[str, list[str]]) -> None:
    assert _spec(_topk4(**extra)) == {}
