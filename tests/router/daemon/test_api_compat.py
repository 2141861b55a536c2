"""Compatibility with the clients users run: `GET /v1/models/{id}` answered as SGLang
0.5.23 answers it (the model card, or a 404 `invalid_request_error` naming the model); the router's own
errors carry OpenAI's `invalid_request_error` type; PD `/server_info` in the gateway's shape, which sglang's
bench_serving reads the accept length from. Real: the router and simulated workers."""

from __future__ import annotations

import time
from typing import Any

import httpx

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE


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


def bench_serving_accept_length(info: dict[str, Any]) -> float | None:
    """sglang 0.5.23 benchmark/serving.py's reading of GET /server_info, line for line."""
    if "decode" in info:
        info = info["decode"][0]
    if "internal_states" in info and info["internal_states"]:  # noqa: RUF019 - bench_serving's own test
        return info["internal_states"][0].get("avg_spec_accept_length", None)  # type: ignore[no-any-return]
    return None


def test_pd_server_info_has_the_gateways_shape_and_bench_serving_reads_the_accept_length() -> None:
    """PD /server_info: the prefill's document as before, plus every prefill's and decode's own under
    "prefill" / "decode" (SGLang's gateway); bench_serving takes the accept length from decode[0]. Before,
    the router answered with the prefill's document only, whose internal_states has no accept length."""
    kw: dict[str, Any] = {"time_scale": TIME_SCALE}
    specs = [WorkerSpec("prefill", **kw), WorkerSpec("decode", spec_alpha=0.8, seed=1, **kw)]
    with start_cluster_in_thread(specs) as cluster:
        pre, dec = cluster.workers
        router = start_router_in_thread(router_config(prefill=[(pre.url, pre.bootstrap_port)], decode=[dec.url],
                                                      health_interval_s=0.3))
        try:
            deadline = time.monotonic() + 60
            while bench_serving_accept_length(httpx.get(dec.url + "/server_info", timeout=10).json()) is None:
                assert time.monotonic() < deadline, "the simulated decode never reported an accept length"
                for _ in range(8):
                    r = httpx.post(router.url + "/generate", json={"text": "hello accept length",
                                                                   "sampling_params": {"max_new_tokens": 16}},
                                   timeout=30)
                    assert r.status_code == 200
            info = httpx.get(router.url + "/server_info", timeout=10).json()
            assert [d["internal_states"][0]["disaggregation_mode"] for d in info["prefill"]] == ["prefill"]
            assert [d["internal_states"][0]["disaggregation_mode"] for d in info["decode"]] == ["decode"]
            assert info["internal_states"][0]["disaggregation_mode"] == "prefill"  # the top level: as before
            accept = bench_serving_accept_length(info)
            assert isinstance(accept, float) and accept > 1.0
            assert httpx.get(router.url + "/get_server_info", timeout=10).json().keys() == info.keys()
        finally:
            router.stop()
