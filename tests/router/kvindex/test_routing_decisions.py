"""Routing decisions on the exact index where the router's own knowledge falls short, on real simulated
workers (collocated, KV events on) behind the real router:

- a prefix that reached a worker past this router (another frontend, a direct call): the router never
  anchored that text, so its first request must be anchored on the request path
  (kv_routing.py `lookup`), or the router cannot see that the worker holds it;
- a prompt answered by a worker that then evicted it is predicted uncached there: the events are the
  truth, not the router's memory of its own decisions.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.sim.kv_client import kv_config

WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health", "inference", "journal"]


def wait_for(cond: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    return cond()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture
def fleet() -> Iterator[ThreadedSimCluster]:
    # time scale 3, as the benchmark runs
    specs = [WorkerSpec("mixed", kv_events_config=kv_config(), speculative=False, seed=i, time_scale=3.0)
             for i in range(4)]
    cluster = start_cluster_in_thread(specs)
    yield cluster
    cluster.stop()


def router_for(cluster: ThreadedSimCluster) -> RouterHandle:
    router = start_router_in_thread(router_config(workers=[w.url for w in cluster.workers], health_interval_s=0.3,
                                                  log_requests=True))
    assert wait_for(lambda: all(d.get("index") == "exact" for d in docs(router).values()))
    return router


def docs(router: RouterHandle) -> dict[str, dict[str, Any]]:
    return {w["url"]: w for w in httpx.get(router.url + "/admin/workers", timeout=5).json()["workers"]}


def done(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    return {r.rid: r for r in caplog.records if r.getMessage() == "request done"}  # type: ignore[attr-defined]


def test_a_prefix_cached_past_the_router_is_found(fleet: ThreadedSimCluster, caplog: pytest.LogCaptureFixture) -> None:
    router = router_for(fleet)
    # what is tested is that an anchored prompt is found, not the request-path budget (5 % of the time,
    # a 50 ms bucket: tests/router/scaleout/test_replica_fleet_faults.py floods it): on a loaded machine the first
    # two anchorings could use up the bucket, and the third prompt was routed as unseen, to the empty
    # worker (cached_tokens 1 of 803 in a full-suite run; the same with each anchoring made 30 ms slower)
    router.router.kv.first_sight_budget = 1.0
    caplog.set_level(logging.INFO, logger="infer_ctl.router")
    rng = random.Random(9)
    tok = BuiltinTokenizer()
    targets = fleet.workers[:3]  # the fourth stays empty: the fallback would prefer it
    prefixes = [f"Tenant {i}. " + words(rng, 600 + 100 * i) for i in range(3)]
    try:
        with httpx.Client(timeout=60) as c:
            for w, p in zip(targets, prefixes, strict=True):  # straight to the worker: the router never sees it
                assert c.post(w.url + "/generate", json={"text": p + " first", "sampling_params": {"max_new_tokens": 2}}
                              ).status_code == 200
            assert wait_for(lambda: all(docs(router)[w.url]["kv_blocks"] > 0 for w in targets))
            for i, p in enumerate(prefixes):
                r = c.post(router.url + "/generate", headers={"x-request-id": f"past-{i}"},
                           json={"text": p + " then " + words(rng, 8), "sampling_params": {"max_new_tokens": 2}})
                assert r.status_code == 200
                assert r.json()["meta_info"]["cached_tokens"] >= 0.9 * len(tok.encode(p))
        recs = done(caplog)
        for i, w in enumerate(targets):
            rec = recs[f"past-{i}"]
            assert (rec.prefill, rec.reason) == (w.url, "cache_hit")
        assert router.router.kv.first_sight["over_budget"] == 0
    finally:
        router.stop()


def test_an_answered_request_stops_counting_as_cached(fleet: ThreadedSimCluster,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """A prompt answered by a worker that then evicted it (a flush here) is predicted as not cached
    there, even moments later (counting the router's decisions of the last 2 s as cached predicted
    the whole prompt: under pressure a worker evicts a conversation between its turns)."""
    router = router_for(fleet)
    caplog.set_level(logging.INFO, logger="infer_ctl.router")
    rng = random.Random(13)
    text = "Tenant flushed. " + words(rng, 800)
    try:
        with httpx.Client(timeout=60) as c:
            assert c.post(router.url + "/generate", headers={"x-request-id": "before"},
                          json={"text": text + " one", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
            url = done(caplog)["before"].prefill
            assert wait_for(lambda: docs(router)[url]["kv_blocks"] > 0)
            assert c.post(url + "/flush_cache").status_code == 200  # idle: the worker flushes, publishes a clear
            assert wait_for(lambda: docs(router)[url]["kv_blocks"] == 0)
            assert c.post(router.url + "/generate", headers={"x-request-id": "after"},
                          json={"text": text + " two", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
        rec = done(caplog)["after"]
        assert (rec.predicted_tokens, rec.cached_tokens) == (0, 0), (rec.prefill, rec.reason)
    finally:
        router.stop()
