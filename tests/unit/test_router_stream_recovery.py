"""Mid-stream recovery's pure parts: which requests can be continued exactly, and the rewriting of a
continuation's events into the first stream's terms (router/request/recovery.py, stream.py)."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.router.request.recovery import continuation, refusal
from infer_ctl.router.request.stream import StreamTrack


class _Ctx:
    def __init__(self, body: dict[str, Any], endpoint: str = "/generate") -> None:
        self.body, self.endpoint = body, endpoint


@pytest.mark.parametrize(("endpoint", "body", "why"), [
    ("/generate", {"text": "x", "sampling_params": {"temperature": 0}}, None),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"temperature": 0.8}}, None),
    ("/v1/chat/completions", {"messages": []}, "openai_endpoint"),
    ("/generate", {"text": ["a", "b"]}, "batch_or_input"),
    ("/generate", {"text": "x", "return_logprob": True}, "logprobs"),
    ("/generate", {"text": "x", "sampling_params": {"n": 2}}, "parallel_samples"),
    ("/generate", {"text": "x", "sampling_params": {"stop": ["\n"]}}, "stop_strings"),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": "a\\s+b"}}, "stop_strings"),
    ("/generate", {"text": "x", "sampling_params": {"beam_width": 4}}, "parallel_samples"),
    ("/generate", {"text": "x", "sampling_params": {"beam_width": 1, "stop_regex": None}}, None),
    ("/generate", {"text": "x", "sampling_params": {"sampling_seed": 3}}, "seeded_sampling"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "a+"}}, "constrained_decoding"),
    ("/generate", {"text": "x", "sampling_params": {"frequency_penalty": 0.5}}, "penalties"),
    ("/generate", {"text": "x", "sampling_params": {"repetition_penalty": 1.0}}, None),
])
def test_which_requests_continue_exactly(endpoint: str, body: dict[str, Any], why: str | None) -> None:
    assert refusal(_Ctx(body, endpoint)) == why  # type: ignore[arg-type]


def _ev(text: str, ids: list[int], c: int, prompt: int = 10) -> dict[str, Any]:
    return {"text": text, "output_ids": ids, "meta_info": {"id": "r1", "completion_tokens": c, "prompt_tokens": prompt,
                                                          "cached_tokens": prompt}}


def test_cumulative_stream_continuation_reads_as_the_rest_of_it() -> None:
    t = StreamTrack()
    t.seen(_ev(" a", [5], 1))
    t.seen(_ev(" a b", [5, 6], 2))
    assert t.not_resumable(128, {"max_new_tokens": 4}) is None
    body = continuation({"text": "p", "rid": "x", "sampling_params": {"max_new_tokens": 4, "min_new_tokens": 3}},
                        [1, 2], t)
    assert body["input_ids"] == [1, 2, 5, 6] and "text" not in body and "rid" not in body
    assert body["sampling_params"] == {"max_new_tokens": 2, "min_new_tokens": 1}
    t.resumed()
    out = t.rewrite({"text": " c", "output_ids": [7], "meta_info": {"id": "r2", "completion_tokens": 1,
                                                                  "prompt_tokens": 12, "cached_tokens": 12,
                                                                  "finish_reason": {"type": "length", "length": 2}}})
    assert out["text"] == " a b c" and out["output_ids"] == [5, 6, 7]
    assert out["meta_info"] == {"id": "r1", "completion_tokens": 3, "prompt_tokens": 10, "cached_tokens": 10,
                                "finish_reason": {"type": "length", "length": 4}}


def test_delta_ids_with_cumulative_text_the_simulators_shape() -> None:
    t = StreamTrack()
    t.seen(_ev(" a", [5], 1))
    t.seen(_ev(" a b", [6], 2))
    assert t.ids == [5, 6] and t.ids_delta is True and t.cumulative_text()
    t.resumed()
    out = t.rewrite(_ev(" c", [7], 1, prompt=12))
    assert out["text"] == " a b c" and out["output_ids"] == [7]


def test_incremental_sglang_stream_stays_incremental() -> None:
    t = StreamTrack()
    t.seen(_ev(" a", [5], 1))
    t.seen(_ev(" a", [6], 2))  # a repeated word: deltas, not a cumulative text
    assert not t.cumulative_text() and t.client_text() == " a a"
    t.resumed()
    assert t.rewrite(_ev(" c", [7], 1))["text"] == " c"


def test_a_cut_too_early_or_without_ids_is_not_continued() -> None:
    t = StreamTrack()
    t.seen(_ev(" a", [5], 1))
    assert t.not_resumable(128, {}) == "too_early"
    u = StreamTrack()
    u.seen({"text": "a", "meta_info": {"completion_tokens": 1}})
    assert not u.active and u.not_resumable(128, {}) == "no_token_ids"
    v = StreamTrack()
    v.seen(_ev(" a", [5], 1))
    v.seen(_ev(" a b", [5, 6], 2))
    assert v.not_resumable(128, {"max_new_tokens": 2}) == "budget_spent"


@pytest.mark.parametrize(("second", "continued", "text", "ids"), [
    (_ev(" a b", [5, 6], 2), _ev(" c", [7], 1), " a c", [5, 7]),  # cumulative ids and text
    (_ev(" a b", [6], 2), _ev(" c", [7], 1), " a c", [7]),  # the simulator's: delta ids, cumulative text
    (_ev(" b", [6], 2), _ev(" c", [7], 1), " c", [7]),  # SGLang's incremental output
])
def test_a_cut_after_the_first_event_takes_the_modes_another_stream_showed(
        second: dict[str, Any], continued: dict[str, Any], text: str, ids: list[int]) -> None:
    other = StreamTrack()
    other.seen(_ev(" a", [5], 1))
    other.seen(second)
    shape = other.shape()
    assert shape is not None
    t = StreamTrack()
    t.seen(_ev(" a", [5], 1))
    t.assume(shape)
    assert t.not_resumable(128, {}) is None and t.ids == [5] and t.client_text() == " a"
    t.resumed()
    out = t.rewrite(continued)
    assert out["text"] == text and out["output_ids"] == ids and out["meta_info"]["completion_tokens"] == 2


def test_no_mode_is_assumed_for_a_stream_with_no_token_or_inconsistent_ids() -> None:
    t = StreamTrack()
    t.assume((True, True))
    assert t.not_resumable(128, {}) == "too_early"
    u = StreamTrack()
    u.seen(_ev(" a", [5, 6], 1))  # two ids, one token counted
    u.assume((True, True))
    assert u.not_resumable(128, {}) == "too_early"
