"""Named prefixes end to end: warm on K replicas, spread, stats, expire, supersede, admin verbs; and the
collocated mode with cache affinity."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

from infer_ctl.router.config import PrefixSpec
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE, pd_router
from tests.waiting import wait_for

SYSTEM = "You are the support assistant of Example Corp. Follow the policy below. " * 12


def prefixes(url: str) -> dict:
    return {p["name"] + f"@v{p['version']}": p for p in httpx.get(url + "/admin/prefixes").json()["prefixes"]}


def test_named_prefix_warm_spread_stats_expire_supersede(pd_cluster: ThreadedSimCluster) -> None:
    router = pd_router(pd_cluster, prefixes=[PrefixSpec("support", SYSTEM, ttl_s=60, replicas=2)])
    try:
        assert wait_for(lambda: sum(r["warm"] for r in prefixes(router.url)["support@v1"]["replicas"]) == 2)
        p = prefixes(router.url)["support@v1"]
        replicas = {r["worker"] for r in p["replicas"]}
        assert len(replicas) == 2

        def ask(i: int) -> httpx.Response:
            return httpx.post(router.url + "/generate", timeout=30,
                              json={"text": SYSTEM + f"Customer {i} asks about refunds.", "sampling_params": {"max_new_tokens": 2}})

        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(ask, range(24)))
        assert {r.status_code for r in results} == {200}
        # every request found the warm prefix in cache, wherever it went
        assert min(r.json()["meta_info"]["cached_tokens"] for r in results) > 0
        per_worker = Counter(w["url"] for w in httpx.get(router.url + "/admin/workers").json()["workers"])
        assert per_worker
        p = prefixes(router.url)["support@v1"]
        stats = p["stats"]
        assert p["tokens"] and p["tokens"] > 50  # learned from the warm-up's prompt_tokens
        assert stats["requests"] == 24 and stats["hit_rate"] >= 0.9
        assert stats["actual_cached_tokens"] > 0 and stats["predicted_cached_tokens"] > 0
        reasons = httpx.get(router.url + "/metrics").text
        assert 'inferctl_router_routing_decisions_total{reason="named_prefix"} 24.0' in reasons
        assert 'inferctl_router_prefix_warm_replicas{prefix="support"} 2.0' in reasons

        # a new version supersedes the old one and is warmed in its place
        r = httpx.post(router.url + "/admin/prefixes", json={"name": "support", "text": SYSTEM + "v2.", "replicas": 1})
        assert r.status_code == 201 and r.json()["prefix"]["version"] == 2
        assert prefixes(router.url)["support@v1"]["state"] == "superseded"
        assert wait_for(lambda: any(x["warm"] for x in prefixes(router.url)["support@v2"]["replicas"]))

        # expiring stops affinity: traffic falls back to the normal policy
        assert httpx.post(router.url + "/admin/prefixes/support/expire").json()["prefix"]["state"] == "expired"
        ask(99)
        assert prefixes(router.url)["support@v2"]["stats"]["requests"] == 0
        assert httpx.post(router.url + "/admin/prefixes/support/warm").status_code == 404
        bad = httpx.post(router.url + "/admin/prefixes", json={"name": "x", "text": "", "replicas": 0})
        assert bad.status_code == 400
    finally:
        router.stop()


def test_prefix_ttl_lapses_on_its_own(pd_cluster: ThreadedSimCluster) -> None:
    router = pd_router(pd_cluster, prefixes=[PrefixSpec("short", SYSTEM, ttl_s=1.0, replicas=1, pin=True)])
    try:
        assert wait_for(lambda: prefixes(router.url)["short@v1"]["state"] == "expired", timeout=5)
        assert 'inferctl_router_prefix_active{prefix="short",version="1"} 0.0' in httpx.get(router.url + "/metrics").text
    finally:
        router.stop()


def test_collocated_mode_routes_a_shared_prefix_to_the_worker_that_cached_it() -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=TIME_SCALE) for _ in range(3)])
    router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=0.5))
    try:
        def ask(i: int) -> httpx.Response:
            return httpx.post(router.url + "/generate", timeout=30,
                              json={"text": f"tenant {i % 3} " + SYSTEM + f"question {i}", "sampling_params": {"max_new_tokens": 2}})

        warm = [ask(i) for i in range(3)]
        later = [ask(i) for i in range(3, 12)]
        assert {r.status_code for r in warm + later} == {200}
        assert all(r.json()["meta_info"]["cached_tokens"] > 100 for r in later)
        assert httpx.get(router.url + "/admin/status").json()["mode"] == "collocated"
    finally:
        router.stop()
        cluster.stop()
