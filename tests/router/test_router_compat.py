"""Compatibility with the clients users run (issue 28 item 10): `GET /v1/models/{id}` answered as SGLang
0.5.23 answers it (the model card, or a 404 `invalid_request_error` naming the model); the router's own
errors carry OpenAI's `invalid_request_error` type. Real: the router and simulated workers."""

from __future__ import annotations

import httpx

from infer_ctl.router.daemon.embed import RouterHandle


def test_a_model_is_retrieved_by_id(router: RouterHandle) -> None:
    r = httpx.get(router.url + "/v1/models/sim-llama-3.1-70b", timeout=10)
    assert r.status_code == 200
    card = r.json()
    assert card["id"] == "sim-llama-3.1-70b" and card["object"] == "model" and card["max_model_len"] > 0
    missing = httpx.get(router.url + "/v1/models/no-such-model", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "invalid_request_error"
    assert missing.json()["error"]["code"] == "model_not_found"


def test_the_routers_own_errors_are_openai_typed(router: RouterHandle) -> None:
    r = httpx.post(router.url + "/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
