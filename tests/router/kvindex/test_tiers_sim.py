"""The router on KV events with a host tier, end to end: simulated collocated workers with HiCache
(write-through host pool) publish their pages with `medium` (GPU, CPU_PINNED, as SGLang 0.5.23's unified
tree core records them); the router's exact index scores the prompt's host continuation at the tier's
weight. A worker holding the prompt only in host memory loses to one holding it in HBM, and beats a cold
one (the router before tier weights saw it as cold)."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer
from infer_ctl.core.routing.prefixes import TIER_GRACE_S
from infer_ctl.router.config import PrefixSpec
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE
from tests.router.kvindex.test_events_router import exact_everywhere, prompt, wait_for
from tests.sim.kv_client import kv_config


@pytest.fixture
def tier_cluster() -> Iterator[ThreadedSimCluster]:
    kw: dict[str, Any] = {"time_scale": TIME_SCALE, "cache_capacity_tokens": 1200, "hicache_ratio": 4.0,
                          "speculative": False}
    cluster = start_cluster_in_thread([WorkerSpec("mixed", kv_events_config=kv_config(), seed=i, **kw)
                                       for i in range(3)])
    yield cluster
    cluster.stop()


def _generate(c: httpx.Client, url: str, text: str, rid: str | None = None) -> dict[str, Any]:
    r = c.post(url + "/generate", headers={"x-request-id": rid} if rid else None,
               json={"text": text, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200, r.text
    return r.json()


def _split(router: RouterHandle, text: str, url: str) -> tuple[int, int]:
    """(HBM-only, every tier) cached units the router's exact index gives `url` for `text`."""
    kv = router.router.kv

    async def get() -> tuple[int, int]:
        hashes = router.router.index.hashes(text)
        saved = kv._weight
        try:
            kv._weight = None
            dev = kv.cached(hashes, text, [url])[0].get(url, 0)
        finally:
            kv._weight = saved
        return dev, kv.cached(hashes, text, [url], weighted=False)[0].get(url, 0)

    return router.call(get())


def test_host_only_holder_loses_to_hbm_holder_and_beats_a_cold_one(
        tier_cluster: ThreadedSimCluster, caplog: pytest.LogCaptureFixture) -> None:
    a, b, c = tier_cluster.workers
    router = start_router_in_thread(router_config(workers=[w.url for w in (a, b, c)], health_interval_s=0.3,
                                                  log_requests=True, tiers={"host_gb_s": 2.0}))
    rng = random.Random(11)
    sysp = "You are the tier test. " + prompt(rng, 500)  # fits one worker's 1,200-token HBM, 3 others do not
    n = len(BuiltinTokenizer().encode(sysp))
    assert 400 < n < 700
    try:
        assert wait_for(lambda: exact_everywhere(router, [a.url, b.url, c.url]))
        w = router.router.kv.tier_weights
        assert w is not None and 0.3 < w.host < 0.6  # 2 GB/s: a host token is worth about half an HBM one
        caplog.set_level(logging.INFO, logger="infer_ctl.router")
        with httpx.Client(timeout=60) as cl:
            _generate(cl, router.url, sysp + " Q: anchor it", "t-0")  # the router anchors the prompt's text
            for wk in (a, b, c):  # then every worker starts empty
                assert httpx.post(wk.url + "/flush_cache", timeout=10).status_code == 200
            assert wait_for(lambda: all(_split(router, sysp, wk.url) == (0, 0) for wk in (a, b, c)))
            _generate(cl, a.url, sysp + " Q: first")  # a and b hold the system prompt in HBM (+ host)
            _generate(cl, b.url, sysp + " Q: first")
            for i in range(3):  # other prompts push it out of a's HBM: it stays in a's host pool
                _generate(cl, a.url, f"Other tenant {i}. " + prompt(rng, 500))
            text = sysp + " Q: which worker?"
            assert wait_for(lambda: _split(router, text, a.url)[0] < 0.1 * n < 0.9 * n < _split(router, text, a.url)[1]), \
                _split(router, text, a.url)
            assert _split(router, text, b.url)[0] > 0.9 * n
            got = _generate(cl, router.url, text, "t-1")
            # b (HBM) wins over a (host only); then b forgets everything: a (host) beats c (cold)
            assert httpx.post(b.url + "/flush_cache", timeout=10).status_code == 200
            assert wait_for(lambda: _split(router, text, b.url) == (0, 0))
            got = _generate(cl, router.url, sysp + " Q: and now?", "t-2")
        done = {r.rid: r for r in caplog.records if r.getMessage() == "request done"}  # type: ignore[attr-defined]
        assert (done["t-1"].prefill, done["t-1"].reason) == (b.url, "cache_hit")  # type: ignore[attr-defined]
        assert (done["t-2"].prefill, done["t-2"].reason) == (a.url, "cache_hit")  # type: ignore[attr-defined]
        details = got["meta_info"]["cached_tokens_details"]
        assert details["host"] > 0.9 * n  # a loaded it back from host memory
        # the accounting's prediction is the unweighted length, what the worker reports
        rec = done["t-2"]
        assert abs(rec.predicted_tokens - rec.cached_tokens) <= 0.02 * got["meta_info"]["prompt_tokens"]  # type: ignore[attr-defined]
    finally:
        router.stop()


@pytest.mark.parametrize("keep", ["host", "hbm"])
def test_named_prefix_keep_follows_the_tier(tier_cluster: ThreadedSimCluster, keep: str) -> None:
    """keep host: pushed out of HBM into host memory and idle past rewarm_idle_s, it is not warmed again;
    keep hbm: it is (not for idling: rewarm_idle_s is long there), which loads it back into HBM."""
    rng = random.Random(12)
    sysp = "You are the keep test. " + prompt(rng, 500)
    router = start_router_in_thread(router_config(
        workers=[w.url for w in tier_cluster.workers], health_interval_s=0.3,
        rewarm_idle_s=1.0 if keep == "host" else 300.0,
        prefixes=[PrefixSpec("p", sysp, replicas=1, keep=keep)]))
    kv, warmer_hashes = router.router.kv, router.router.index.hashes(sysp)

    def doc() -> dict[str, Any]:
        return httpx.get(router.url + "/admin/prefixes", timeout=5).json()["prefixes"][0]

    def where(url: str) -> str | None:
        async def get() -> str | None:
            return kv.residency(warmer_hashes, sysp, url)
        return router.call(get())

    try:
        assert wait_for(lambda: exact_everywhere(router, [w.url for w in tier_cluster.workers]))
        assert wait_for(lambda: doc()["replicas"] and doc()["replicas"][0]["warm"])
        rep = doc()["replicas"][0]["worker"]
        assert wait_for(lambda: where(rep) == "hbm")  # the warm-up's pages, anchored by the router
        assert doc()["keep"] == keep and doc()["stats"]["warmups"] == 1
        with httpx.Client(timeout=60) as cl:
            for i in range(3):  # other prompts push it out of the replica's HBM, into its host pool
                _generate(cl, rep, f"Other tenant {i}. " + prompt(rng, 500))
        if keep == "host":
            assert wait_for(lambda: where(rep) == "host")
            time.sleep(TIER_GRACE_S + 1.5)  # idle past rewarm_idle_s (1 s) and past the grace
            assert doc()["stats"]["warmups"] == 1 and where(rep) == "host"
        else:  # warmed again (after the grace) and back in HBM
            assert wait_for(lambda: doc()["stats"]["warmups"] >= 2, timeout=TIER_GRACE_S + 10)
            assert wait_for(lambda: where(rep) == "hbm")
    finally:
        router.stop()
