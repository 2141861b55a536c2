"""The simulator's request gates against SGLang 0.5.23's own schema decoder (`sglang.api.v1.api_types`,
the code `api_contract.generate_contract_error` runs), when the `sglang` extra is installed."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.sim.contract import body_error, contract_error

HOSTILE: list[dict[str, Any]] = [
    {"text": "a"},
    {"text": "a", "unknown_top_level": 5},  # SGLang ignores unknown top-level keys
    {"text": "a", "sampling_params": {"max_new_tokens": "x"}},
    {"text": "a", "sampling_params": {"max_new_tokens": None}},
    {"text": "a", "sampling_params": {"max_new_tokens": -1}},  # admitted here, a ValueError later
    {"text": "a", "sampling_params": {"foo": 1}},
    {"text": "a", "sampling_params": {"temperature": 1, "top_p": "0.9"}},
    {"text": "a", "sampling_params": {"stop": ["x", "y"], "stop_token_ids": [1, "a"]}},
    {"text": "a", "sampling_params": {"stop": {}}},
    {"text": "a", "sampling_params": {"ignore_eos": 1}},
    {"text": "a", "sampling_params": {"n": 2.5}},
    {"text": "a", "sampling_params": [{"max_new_tokens": 1}, 5]},
    {"text": "a", "sampling_params": {"watermark": "on"}},
    {"text": "a", "priority": True},
    {"text": "a", "priority": "5"},
    {"text": "a", "priority": 1.5},
    {"text": "a", "stream": "yes"},
    {"text": "a", "stream": 1},
    {"text": "a", "rid": [1]},
    {"text": "a", "rid": {}},
    {"text": "a", "return_logprob": "yes"},
    {"text": "a", "return_logprob": [1]},
    {"text": "a", "logprob_start_len": 1.5},
    {"text": "a", "top_logprobs_num": "3"},
    {"text": "a", "return_text_in_logprobs": 1},
    {"text": "a", "bootstrap_room": "5"},
    {"text": "a", "bootstrap_room": ["a"]},
    {"text": "a", "bootstrap_room": [1, None]},
    {"text": "a", "bootstrap_room": -1},
    {"text": "a", "bootstrap_port": None, "bootstrap_host": ["h", None]},
    {"text": "a", "bootstrap_host": 5},
]


def test_body_gate_refuses_what_pydantic_refuses() -> None:
    for bad in ([1, 2], "x", None, {"text": 1}, {"text": ["a", 2]}, {"input_ids": "abc"}, {"input_ids": [1, "a"]},
                {"input_ids": [[1], [2, None]]}, {"text": "a", "sampling_params": 5}):
        assert body_error(bad) is not None, bad
    for ok in ({"text": "a"}, {"input_ids": [1, 2]}, {"input_ids": [[1], [2]]}, {"text": ["a", "b"]}, {}):
        assert body_error(ok) is None, ok


@pytest.mark.parametrize("body", HOSTILE, ids=lambda b: repr(b)[:60])
def test_contract_gate_matches_sglang_decoder(body: dict[str, Any]) -> None:
    api = pytest.importorskip("sglang.api.v1.api_types", reason="the sglang extra is not installed")
    try:
        api.GenerateRequest.from_json_value(body)
        expected = None
    except api.JsonContractError as exc:
        expected = str(exc)
    assert contract_error(body) == expected
