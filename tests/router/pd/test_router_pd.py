"""The router in front of simulated PD workers (real HTTP, real bootstrap rooms: the simulator fails a
request whose prefill and decode were not paired under one room)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from infer_ctl.router.daemon.embed import RouterHandle
from infer_ctl.sim.cluster import ThreadedSimCluster

PROMPT = "You are a terse assistant for Example Corp. " * 20


def gen(url: str, text: str, n: int = 4, **extra) -> httpx.Response:
    body = {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0}, **extra}
    return httpx.post(url + "/generate", json=body, timeout=30)


def test_concurrent_pd_requests_are_paired_correctly(router: RouterHandle, pd_cluster: ThreadedSimCluster) -> None:
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: gen(router.url, f"tenant {i % 5}: " + PROMPT + f"question {i}"), range(40)))
    assert [r.status_code for r in results] == [200] * 40
    assert all(r.json()["meta_info"]["completion_tokens"] == 4 for r in results)
    assert all(r.headers["X-Request-Id"] for r in results)
    for w in pd_cluster.workers:
        if w.spec.role == "prefill":
            assert w.rooms.bootstrap_failed == 0 and w.rooms.transfer_failed == 0
    used = {w["url"]: w["requests"] for w in httpx.get(router.url + "/admin/workers").json()["workers"]}
    assert sum(used.values()) == 80  # one prefill + one decode call per request, no retries


def test_same_prefix_is_routed_to_the_prefill_that_cached_it(router: RouterHandle) -> None:
    text = "A long shared system prompt about routing. " * 30
    first = gen(router.url, text + "first question")
    second = gen(router.url, text + "second question")
    assert first.status_code == second.status_code == 200
    assert second.json()["meta_info"]["cached_tokens"] >= 0.8 * len(text) / 8  # the prefix was a hit
    metrics = httpx.get(router.url + "/metrics").text
    assert 'inferctl_router_routing_decisions_total{reason="cache_hit"}' in metrics


def test_openai_endpoints_and_models(router: RouterHandle) -> None:
    chat = httpx.post(router.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], "max_tokens": 3})
    assert chat.status_code == 200 and chat.json()["choices"][0]["message"]["content"]
    comp = httpx.post(router.url + "/v1/completions", json={"prompt": "Once upon", "max_tokens": 3}, timeout=30)
    assert comp.status_code == 200 and comp.json()["choices"][0]["text"]
    models = httpx.get(router.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"]
    assert httpx.get(router.url + "/health").json()["status"] == "ok"


def test_streaming_relays_every_chunk_then_done(router: RouterHandle) -> None:
    chunks = []
    t0 = time.monotonic()
    with httpx.stream("POST", router.url + "/generate", timeout=30,
                      json={"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 12}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append((time.monotonic() - t0, line[6:]))
    assert chunks[-1][1] == "[DONE]"
    events = [json.loads(c) for _, c in chunks[:-1]]
    assert events[-1]["meta_info"]["completion_tokens"] == 12
    assert len(events) >= 3  # relayed incrementally, not buffered into one
    chat_lines = []
    with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}) as r:
        chat_lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert chat_lines[-1] == "data: [DONE]" and len(chat_lines) >= 3


def test_client_disconnect_cancels_the_upstream_request(router: RouterHandle, pd_cluster: ThreadedSimCluster) -> None:
    with httpx.stream("POST", router.url + "/generate", timeout=30,
                      json={"text": PROMPT + "long one", "stream": True, "sampling_params": {"max_new_tokens": 100_000}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # got the first token; now hang up
    def decode_running() -> int:
        docs = [httpx.get(w.url + "/v1/loads").json() for w in pd_cluster.workers if w.spec.role == "decode"]
        return sum(r["num_running_reqs"] for d in docs for r in d.get("loads", [d]))

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        inflight = sum(w["inflight"] for w in httpx.get(router.url + "/admin/workers").json()["workers"])
        if inflight == 0 and decode_running() == 0:
            break
        time.sleep(0.05)
    assert inflight == 0 and decode_running() == 0  # 100k tokens would take minutes


def test_bad_requests_get_json_errors(router: RouterHandle) -> None:
    bad = httpx.post(router.url + "/generate", content=b"{not json", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    arr = httpx.post(router.url + "/generate", json=[1, 2], timeout=10)
    assert arr.status_code == 400 and "JSON object" in arr.json()["error"]["message"]
    # a worker-side client error is passed through, not retried
    too_long = gen(router.url, "x", n=200_000)
    assert too_long.status_code == 400


def test_metrics_expose_the_documented_families(router: RouterHandle) -> None:
    gen(router.url, PROMPT)
    text = httpx.get(router.url + "/metrics").text
    for name in ("inferctl_router_requests_total", "inferctl_router_request_duration_seconds",
                 "inferctl_router_ttft_seconds", "inferctl_router_itl_seconds",
                 "inferctl_router_routing_decision_seconds", "inferctl_router_worker_inflight",
                 "inferctl_router_worker_healthy", "inferctl_router_worker_cb_state",
                 "inferctl_router_cache_predicted_tokens_total", "inferctl_router_cache_actual_tokens_total",
                 "inferctl_router_retries_total"):
        assert f"# TYPE {name}" in text, name


def test_prefill_without_a_bootstrap_port_uses_the_one_it_reports(pd_cluster: ThreadedSimCluster) -> None:
    """`--prefill URL` without @PORT: sent as null, a decode would use its own default port (8998 in
    SGLang) and fail the transfer; the router fills in the port from the prefill's /server_info."""
    from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

    pre = [w for w in pd_cluster.workers if w.spec.role == "prefill"][:1]
    dec = [w.url for w in pd_cluster.workers if w.spec.role == "decode"]
    cfg = router_config(prefill=[(pre[0].url, None)], decode=dec, health_interval_s=0.2, max_retries=0)
    with start_router_in_thread(cfg) as handle:
        deadline = time.monotonic() + 5
        port = None
        while time.monotonic() < deadline and port is None:
            ws = httpx.get(handle.url + "/admin/workers").json()["workers"]
            port = next(w["bootstrap_port"] for w in ws if w["role"] == "prefill")
            time.sleep(0.05)
        assert port == pre[0].bootstrap_port
        r = gen(handle.url, "learned bootstrap port")
        assert r.status_code == 200, r.text
