"""Decode-side HiCache in the simulator: a PD decode with SGLang's decode radix cache
(--disaggregation-decode-enable-radix-cache) keeps finished sequences in its own tree, with a host tier
under it, matches each new request there before decoding and restores host hits into HBM; without the
flag a PD decode runs no radix cache, as SGLang's does (handle_pd_disaggregation)."""

from __future__ import annotations

import concurrent.futures as cf
import random
from typing import Any

import httpx
import pytest

from infer_ctl.checks.hicache import hicache_findings
from infer_ctl.core.sglang import instances
from infer_ctl.core.sglang.hicache_health import parse_metrics
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.from_profile import specs_from_profile

COMMON: dict[str, Any] = {"time_scale": 0.05, "cache_capacity_tokens": 1000, "speculative": False}


def _prompt(i: int, n: int = 400) -> list[int]:
    return [i * 10_000 + t for t in range(n)]


def _pd(cluster: ThreadedSimCluster, decode: int, ids: list[int]) -> dict[str, Any]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": cluster.workers[0].bootstrap_port, "bootstrap_room": random.randint(1, 2**62)}
    with cf.ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, cluster.urls[0] + "/generate", json=body, timeout=30)
        fd = ex.submit(httpx.post, cluster.urls[decode] + "/generate", json=body, timeout=30)
        assert fp.result().status_code == 200
        d = fd.result()
    assert d.status_code == 200, d.text
    meta: dict[str, Any] = d.json()["meta_info"]
    return meta


def test_a_decode_radix_cache_keeps_finished_sequences_in_its_tiers_and_restores_host_hits() -> None:
    specs = [WorkerSpec("prefill", **COMMON),
             WorkerSpec("decode", decode_radix_cache=True, hicache_ratio=3.0, **COMMON),
             WorkerSpec("decode", hicache_ratio=3.0, **COMMON)]  # fmt: skip
    with start_cluster_in_thread(specs) as cluster:
        radix, plain = cluster.urls[1], cluster.urls[2]
        for decode in (1, 2):
            for i in range(4):  # 4 x ~403 tokens > 1,000 in the decode's HBM
                _pd(cluster, decode, _prompt(i))
            again = _pd(cluster, decode, _prompt(0))  # prompt 0 left the decode's HBM: in its host tier
            # the prefill evicted prompt 0 (cached 0): SGLang adds the decode's own reuse beyond the
            # prefill's hit to cached_tokens, as device tokens (prepare_for_prebuilt)
            want = (399, {"device": 399, "host": 0}) if decode == 1 else (0, None)  # None: nothing cached
            assert (again["cached_tokens"], again["cached_tokens_details"]) == want
        d_cache = cluster.workers[1].cache
        m = parse_metrics(httpx.get(radix + "/metrics").text)
        assert m.get("sglang:hicache_host_total_tokens") == 3000
        assert m.get("sglang:hicache_host_used_tokens") and m.total("sglang:evicted_tokens_total") > 0
        text = httpx.get(radix + "/metrics").text
        load_back = [ln for ln in text.splitlines() if ln.startswith("sglang:load_back_tokens_total{")]
        assert load_back and float(load_back[0].rsplit(" ", 1)[1]) == 399  # prompt 0 restored from host
        assert d_cache.match_prefix(_prompt(0)).length == 400  # and back in the tree
        # without the flag a PD decode runs no radix cache: HiCache settings do nothing there
        assert "sglang:hicache_host_used_tokens" not in httpx.get(plain + "/metrics").text
        assert cluster.workers[2].cache.match_prefix(_prompt(0)).length == 0
        info = httpx.get(radix + "/server_info").json()
        assert info["disaggregation_decode_enable_radix_cache"] is True and info["enable_hierarchical_cache"] is True
        # `check servers` reads the decode's host tier as it reads a prefill's
        port = int(radix.rsplit(":", 1)[1])
        profile = validate_profile_data({
            "name": "t",
            "nodes": [{"name": "pf", "host": "127.0.0.9", "roles": ["prefill"]},
                      {"name": "dc", "host": "127.0.0.1", "roles": ["decode"], "overrides": {"decode_port": port}}],
            "models": {"target": {"path": "/m"}},
            "sglang": {"hicache": {"roles": ["prefill", "decode"], "ratio": 3.0, "decode": {"mode": "radix"}}},
        })  # fmt: skip
        dec = [i for i in instances(profile) if i.role == "decode"]
        found = {f.check: f.status.value for f in hicache_findings(profile, dec)}
        assert found == {"servers.hicache_host": "ok", "servers.hicache_backup": "ok"}


def test_the_profile_gives_a_radix_decode_its_tiers_and_an_offload_decode_none() -> None:
    def specs(decode: dict[str, Any]) -> list[WorkerSpec]:
        return specs_from_profile(validate_profile_data({
            "name": "t",
            "nodes": [{"name": "pf", "host": "10.0.0.1", "roles": ["prefill"]},
                      {"name": "dc", "host": "10.0.0.2", "roles": ["decode"]}],
            "models": {"target": {"path": "/m", "preset": "llama-3.1-70b"}},
            "sglang": {"hicache": {"roles": ["prefill", "decode"], "storage": {"backend": "file"}, "decode": decode},
                       "extra_args": {"prefill": ["--page-size", "64"], "decode": ["--page-size", "64"]}},
        }))  # fmt: skip

    _, dec = specs({"mode": "radix", "ratio": 1.5})
    assert (dec.decode_radix_cache, dec.hicache_ratio, dec.hicache_storage_backend, dec.hicache) == (
        True, 1.5, "file", True)
    _, off = specs({"mode": "offload"})
    assert not off.decode_radix_cache and not off.hicache and off.tier_config(off.timing()) is None
    with pytest.raises(ValueError, match="decode_radix_cache is a decode setting"):
        WorkerSpec("prefill", decode_radix_cache=True)
