"""The SGLang 0.5.23 HTTP API contract of a simulated worker, endpoint by endpoint, over real HTTP."""

from __future__ import annotations

import json

import httpx
import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster


def _sse(lines: list[str]) -> list[object]:
    data = [ln[5:].strip() for ln in lines if ln.startswith("data:")]
    assert data[-1] == "[DONE]", "an SGLang stream ends with data: [DONE]"
    return [json.loads(d) for d in data[:-1]]


@pytest.fixture()
def mixed(cluster: ThreadedSimCluster) -> str:
    return cluster.urls[0]


@pytest.mark.parametrize("path", ["/health", "/health_generate"])
def test_health_endpoints_answer_200_when_ready(mixed: str, path: str) -> None:
    assert httpx.get(mixed + path).status_code == 200


def test_ready_server_info_and_deprecated_alias(mixed: str, cluster: ThreadedSimCluster) -> None:
    assert httpx.get(mixed + "/ready").status_code == 200
    info = httpx.get(mixed + "/server_info").json()
    old = httpx.get(mixed + "/get_server_info").json()
    assert info["version"] == "0.5.23" and old["version"] == "0.5.23"
    assert info["disaggregation_mode"] == "null"
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 4
    assert "startup_time" in info and info["internal_states"][0]["disaggregation_mode"] == "null"
    prefill = httpx.get(cluster.urls[1] + "/server_info").json()
    assert prefill["disaggregation_mode"] == "prefill"
    assert prefill["disaggregation_bootstrap_port"] == cluster.workers[1].bootstrap_port


@pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
def test_model_info(mixed: str, path: str) -> None:
    body = httpx.get(mixed + path).json()
    assert body["model_path"] == "sim-llama-3.1-70b" and body["is_generation"] is True
    assert {"served_model_name", "tokenizer_path", "weight_version", "architectures"} <= set(body)


def test_v1_models(mixed: str) -> None:
    body = httpx.get(mixed + "/v1/models").json()
    assert body["object"] == "list"
    (model,) = body["data"]
    assert model["id"] == "sim-llama-3.1-70b" and model["owned_by"] == "sglang" and model["max_model_len"]


def test_v1_loads_has_core_spec_and_disagg_fields(mixed: str) -> None:
    # SGLang adds the speculative section once a decode log interval (40 batches) has completed
    httpx.post(mixed + "/generate", json={"text": "warm the counters", "sampling_params": {"max_new_tokens": 400}})
    (load,) = httpx.get(mixed + "/v1/loads").json()["loads"]
    for key in ("num_running_reqs", "num_waiting_reqs", "num_used_tokens", "max_total_num_tokens",
                "token_usage", "gen_throughput", "cache_hit_rate", "utilization"):
        assert key in load
    assert set(load["speculative"]) == {"accept_length", "accept_rate"}
    assert "prefill_bootstrap_queue_reqs" in load["disaggregation"]


def test_generate_non_stream_meta_info(mixed: str) -> None:
    r = httpx.post(mixed + "/generate", json={"text": "The capital of France is", "sampling_params": {"max_new_tokens": 12}})
    assert r.status_code == 200
    body = r.json()
    meta = body["meta_info"]
    assert meta["completion_tokens"] == 12 and len(body["output_ids"]) == 12
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["prompt_tokens"] > 0 and meta["e2e_latency"] > 0
    assert meta["spec_verify_ct"] >= 1
    assert meta["spec_accept_length"] == pytest.approx(12 / meta["spec_verify_ct"])
    assert isinstance(body["text"], str) and body["text"]


def test_generate_without_sampling_params_takes_sglangs_defaults(mixed: str) -> None:
    """No sampling_params at all (curl's first try): SGLang's defaults (128 new tokens, temperature 1.0)."""
    r = httpx.post(mixed + "/generate", json={"text": "The capital of France is"})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 128


def test_generate_input_ids_and_stream(mixed: str) -> None:
    body = {"input_ids": [1, 2, 3, 4, 5], "stream": True, "sampling_params": {"max_new_tokens": 10}}
    with httpx.stream("POST", mixed + "/generate", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        chunks = _sse(list(r.iter_lines()))
    assert len(chunks) >= 2
    ids = [t for c in chunks for t in c["output_ids"]]  # type: ignore[index]
    assert len(ids) == 10, "output_ids are incremental per chunk"
    last = chunks[-1]["meta_info"]  # type: ignore[index]
    assert last["finish_reason"]["type"] == "length" and last["completion_tokens"] == 10
    assert chunks[0]["meta_info"]["finish_reason"] is None  # type: ignore[index]


def test_generate_batch_returns_a_list(mixed: str) -> None:
    r = httpx.post(mixed + "/generate", json={"text": ["a b c", "d e f"], "sampling_params": {"max_new_tokens": 3}})
    assert r.status_code == 200 and isinstance(r.json(), list) and len(r.json()) == 2


def test_chat_completions_non_stream_usage_has_cached_tokens(mixed: str) -> None:
    msgs = [{"role": "system", "content": "You are terse. " * 30}, {"role": "user", "content": "hi"}]
    first = httpx.post(mixed + "/v1/chat/completions", json={"model": "m", "messages": msgs, "max_tokens": 5}).json()
    second = httpx.post(mixed + "/v1/chat/completions", json={"model": "m", "messages": msgs, "max_tokens": 5}).json()
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["message"]["role"] == "assistant"
    assert first["usage"]["completion_tokens"] == 5
    # an EAGLE worker (the default preset) keys its radix tree by bigrams, as SGLang does: of n prompt
    # tokens at most n - 1 are matched, which are n - 2 bigrams
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == first["usage"]["prompt_tokens"] - 2


def test_chat_completions_stream_with_usage(mixed: str) -> None:
    body = {"model": "m", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 6}
    with httpx.stream("POST", mixed + "/v1/chat/completions", json=body) as r:
        chunks = _sse(list(r.iter_lines()))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # type: ignore[index]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert chunks[-1]["usage"]["completion_tokens"] == 6  # type: ignore[index]
    # as SGLang's, the finishing chunk's delta carries no content (tests/engine/test_sim_differential.py)
    assert "content" not in chunks[-2]["choices"][0]["delta"]  # type: ignore[index]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])  # type: ignore[index]
    assert text.strip()


def test_completions_non_stream(mixed: str) -> None:
    body = httpx.post(mixed + "/v1/completions", json={"model": "m", "prompt": "Once upon", "max_tokens": 4}).json()
    assert body["object"] == "text_completion" and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 4


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"sampling_params": {"max_new_tokens": 3}}, "Either text, input_ids or input_embeds"),
        ({"text": "x", "input_ids": [1]}, "Only one of text, input_ids"),
        ({"text": "x", "sampling_params": {"max_new_tokens": 200_000}}, "maximum context length"),
        ({"text": "x", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be at least 0, got -1."),
    ],
)
def test_generate_malformed_requests_get_sglang_400(mixed: str, body: dict[str, object], fragment: str) -> None:
    # ValueErrors of tokenizer_manager.generate_request: 400 {"error": {"message"}}
    r = httpx.post(mixed + "/generate", json=body)
    assert r.status_code == 400
    assert fragment in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"text": "x", "sampling_params": {"max_new_tokens": "many"}}, 'invalid type: string "many", expected i64'),
        ({"text": "x", "sampling_params": {"temprature": 0}}, "unknown field `temprature`, expected one of"),
        ({"text": "x", "priority": True}, "invalid type: boolean `true`, expected i64"),
        ({"text": "x", "stream": "yes"}, 'invalid type: string "yes", expected a boolean'),
    ],
)
def test_schema_contract_errors_are_400_with_a_string_error(mixed: str, body: dict[str, object], text: str) -> None:
    # api_contract.generate_contract_error: 400 {"error": "<serde text>"}
    r = httpx.post(mixed + "/generate", json=body)
    assert r.status_code == 400 and r.json()["error"].startswith(text)


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'{"text": 1}', b'{"input_ids": "nope"}', b""])
def test_unparsable_bodies_are_fastapi_validation_errors(mixed: str, raw: bytes) -> None:
    # FastAPI's RequestValidationError, rendered by SGLang's handler as a 400 ErrorResponse
    r = httpx.post(mixed + "/generate", content=raw, headers={"content-type": "application/json"})
    body = r.json()
    assert r.status_code == 400 and body["object"] == "error" and body["type"] == "Bad Request"
    assert body["code"] == 400 and "validation error" in body["message"]


def test_stream_value_error_is_an_sse_error_chunk_on_a_200(mixed: str) -> None:
    body = {"text": "x", "input_ids": [1], "stream": True}
    r = httpx.post(mixed + "/generate", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in r.text.splitlines() if ln]
    assert lines[-1] == "data: [DONE]"
    err = json.loads(lines[0][len("data: "):])["error"]
    assert err["code"] == 400 and err["type"] == "invalid_request_error" and "Only one of" in err["message"]


def test_ready_has_an_empty_body(mixed: str) -> None:
    r = httpx.get(mixed + "/ready")
    assert r.status_code == 200 and r.content == b""


def test_openai_errors_use_openai_shape(mixed: str) -> None:
    r = httpx.post(mixed + "/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 400
    assert r.json() == {"object": "error", "message": "Messages cannot be empty.", "type": "BadRequestError",
                        "param": None, "code": 400}
    r = httpx.post(mixed + "/v1/chat/completions", json={"model": "m"})
    assert r.status_code == 400 and r.json()["type"] == "Bad Request" and "Field required" in r.json()["message"]


def test_metrics_use_sglang_names(mixed: str) -> None:
    httpx.post(mixed + "/generate", json={"text": "metrics please", "sampling_params": {"max_new_tokens": 4}})
    text = httpx.get(mixed + "/metrics").text
    for name in ("sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_count",
                 "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:cache_hit_rate",
                 "sglang:spec_accept_length", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                 "sglang:e2e_request_latency_seconds_sum", "sglang:token_usage"):
        assert name in text, name
    assert 'engine_type="unified"' in text


def test_flush_cache_idle_ok(mixed: str) -> None:
    r = httpx.post(mixed + "/flush_cache")
    assert r.status_code == 200 and "Cache flushed" in r.text


def test_flush_cache_busy_is_400_and_client_disconnect_aborts(mixed: str) -> None:
    body = {"text": "long one", "stream": True, "sampling_params": {"max_new_tokens": 100_000}}
    with httpx.stream("POST", mixed + "/generate", json=body) as r:
        lines = r.iter_lines()  # keep the iterator: dropping it closes the stream
        assert next(lines).startswith("data:")  # the request is running now
        busy = httpx.get(mixed + "/flush_cache")
        # SGLang 0.5.23 answers its fallback text; "pending requests" is only in its scheduler's log
        # (measured against the engine: tests/engine/test_sim_differential.py)
        assert busy.status_code == 400 and busy.text == "Flush cache failed.\n"
    # closing the stream disconnects the client; SGLang aborts the request and the server goes idle
    for _ in range(200):
        if httpx.get(mixed + "/v1/loads").json()["loads"][0]["num_running_reqs"] == 0:
            break
    assert httpx.post(mixed + "/flush_cache").status_code == 200
