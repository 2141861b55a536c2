"""Decode chosen by capacity: a decode whose free KV cannot hold the request's prompt plus
max tokens is not chosen while another can. Pure policy, the router's estimate, and a run on the simulator
with SGLang's decode retraction: long outputs where request-count choice overflows the small decode's KV
(retractions in the answers' meta_info) and capacity choice does not."""

from __future__ import annotations

import concurrent.futures as cf
import random

import httpx

from infer_ctl.core.routing.capacity import DEFAULT_MAX_TOKENS, kv_need, max_tokens
from infer_ctl.core.routing.policy import WorkerView, choose_decode
from infer_ctl.router.config import RouterConfig, worker
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.router.fleet.workers import WorkerRegistry
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.waiting import wait_for


def test_a_decode_that_cannot_hold_the_request_is_not_chosen_while_another_can() -> None:
    rng = random.Random(0)
    small, big = WorkerView("http://s", 0, 0, True, 500), WorkerView("http://b", 5, 0, True, 10_000)
    assert choose_decode([small, big], rng).url == "http://s"  # by count: the idle small one
    assert choose_decode([small, big], rng, need=1_000).url == "http://b"
    # none can: the policy chooses among all (least loaded)
    assert choose_decode([small, WorkerView("http://b", 5, 0, True, 900)], rng, need=1_000).url == "http://s"
    # unknown capacity is not excluded
    assert choose_decode([small, WorkerView("http://u", 1)], rng, need=1_000).url == "http://u"


def test_kv_need_is_prompt_plus_max_tokens_per_sequence() -> None:
    assert max_tokens("/generate", {"sampling_params": {"max_new_tokens": 700}}) == 700
    assert max_tokens("/v1/chat/completions", {"max_completion_tokens": 5, "max_tokens": 9}) == 5
    assert max_tokens("/v1/completions", {"max_tokens": 9}) == 9
    assert max_tokens("/v1/completions", {"max_tokens": True}) == DEFAULT_MAX_TOKENS
    assert kv_need("/v1/completions", {"max_tokens": 100, "n": 3}, 400, 4.0) == 100 + 300
    assert kv_need("/generate", {"sampling_params": {"max_new_tokens": 10, "n": 2}}, 40, 4.0) == 10 + 20


def test_the_routers_estimate_counts_what_its_requests_may_grow_to() -> None:
    reg = WorkerRegistry(RouterConfig(workers=[worker("http://d", "decode")]))
    w = reg.by_url["http://d"]
    assert w.kv_free() is None  # never polled
    w.kv_total, w.kv_used = 3_000, 200
    assert w.kv_free() == 2_800
    w.routed(1_000)
    w.inflight = 2
    assert w.kv_free() == 1_000  # 2 in flight that may grow to 1,000 each: more than the poll's 200


def _run(decode_capacity: bool) -> tuple[int, int]:
    """1P + 2D (a small decode of 2,500 KV tokens, a large one of 40,000), 8 requests at once of 8 prompt
    tokens and 1,000 output tokens: (failed requests, retractions summed over the answers)."""
    base = {"time_scale": 0.005, "speculative": False, "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    c = start_cluster_in_thread([WorkerSpec("prefill", **base),  # type: ignore[arg-type]
                                 WorkerSpec("decode", cache_capacity_tokens=2_500, decode_retraction=True, **base),  # type: ignore[arg-type]
                                 WorkerSpec("decode", cache_capacity_tokens=40_000, decode_retraction=True, **base)])  # type: ignore[arg-type]
    try:
        cfg = router_config(prefill=[(c.urls[0], c.workers[0].bootstrap_port)], decode=c.urls[1:],
                            health_interval_s=0.1, decode_capacity=decode_capacity)
        with start_router_in_thread(cfg) as h:
            wait_for(lambda: all(w.get("max_total_tokens") is not None or w["role"] != "prefill"
                                 for w in httpx.get(h.url + "/admin/workers", timeout=5).json()["workers"]), 10)
            wait_for(lambda: all(x["load_age_s"] is not None
                                 for x in httpx.get(h.url + "/admin/pd", timeout=5).json()["workers"]), 10)

            def one(i: int) -> httpx.Response:
                return httpx.post(h.url + "/generate", json={"text": f"req {i} long output",
                                                             "sampling_params": {"max_new_tokens": 1_000}}, timeout=120)

            with cf.ThreadPoolExecutor(8) as ex:
                answers = list(ex.map(one, range(8)))
        failed = sum(a.status_code != 200 for a in answers)
        retracted = sum(a.json()["meta_info"]["num_retractions"] for a in answers if a.status_code == 200)
        return failed, retracted
    finally:
        c.stop()


def test_long_outputs_overflow_a_decode_by_request_count_and_not_by_capacity() -> None:
    failed, by_count = _run(decode_capacity=False)
    assert failed == 0 and by_count > 0
    failed, by_capacity = _run(decode_capacity=True)
    assert failed == 0 and by_capacity == 0, (by_count, by_capacity)


def test_a_decode_nvlink_connected_to_the_prefill_is_preferred_while_about_as_loaded() -> None:
    rng = random.Random(0)
    far, close = WorkerView("http://far", 0), WorkerView("http://close", 2)
    assert choose_decode([far, close], rng).url == "http://far"
    assert choose_decode([far, close], rng, near={"http://close"}).url == "http://close"
    busy = WorkerView("http://close", 3)  # over the slack: the least loaded wins
    assert choose_decode([far, busy], rng, near={"http://close"}).url == "http://far"
    # capacity first: a near decode that cannot hold the request is not preferred
    full = WorkerView("http://close", 0, 0, True, 100)
    assert choose_decode([WorkerView("http://far", 1), full], rng, need=1_000, near={"http://close"}).url == "http://far"


def test_nvlink_domains_come_from_the_profile_by_host() -> None:
    from infer_ctl.profile.load import validate_profile_data
    from infer_ctl.router.config import from_profile

    prof = validate_profile_data({
        "name": "nvl", "models": {"target": {"path": "/m/t", "tp": 8}},
        "nodes": [{"name": "a", "host": "10.0.0.1", "roles": ["prefill", "decode"], "nvlink_domain": "rack1"},
                  {"name": "b", "host": "10.0.0.2", "roles": ["decode"], "nvlink_domain": "rack1"},
                  {"name": "c", "host": "10.0.0.3", "roles": ["prefill", "decode"]}]})
    cfg = from_profile(prof, env={})
    assert cfg.nvlink_domains == {"10.0.0.1": "rack1", "10.0.0.2": "rack1"}
    reg = WorkerRegistry(cfg)
    pre_a = next(w.url for w in reg.all() if w.role == "prefill" and "10.0.0.1" in w.url)
    pre_c = next(w.url for w in reg.all() if w.role == "prefill" and "10.0.0.3" in w.url)
    assert {u.split("//")[1].split(":")[0] for u in reg.near(pre_a)} == {"10.0.0.1", "10.0.0.2"}
    assert reg.near(pre_c) == set()
