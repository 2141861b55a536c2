"""HiCache in the simulator: the host (and storage) tier under the radix cache, their write policies,
eviction to host instead of dropping, load-backs that cost time by size, SGLang's series and
cached_tokens_details, KV events per medium; a worker serving them, and `check servers` reading it."""

from __future__ import annotations

import httpx
import pytest

from infer_ctl.checks.hicache import hicache_findings
from infer_ctl.core.sglang import instances
from infer_ctl.core.sglang.hicache_health import parse_metrics
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.from_profile import specs_from_profile
from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder
from infer_ctl.sim.radix import RadixCache
from infer_ctl.sim.tiers import (
    DEFERRED_REASONS,
    UNFULFILLED_REASONS,
    HiRadixCache,
    TierConfig,
    WritePolicy,
    tier_families,
)

A = list(range(1000, 1060))
B = list(range(2000, 2060))
C = list(range(3000, 3060))
BYTES = 1000  # per token
HOST_BW = 1e9  # bytes/s: 60 tokens load in 60 us


def _cache(host: int = 300, policy: WritePolicy = "write_through", events: KvEventRecorder | None = None,
           **kw: object) -> HiRadixCache:
    tiers = TierConfig(host_capacity_tokens=host, kv_bytes_per_token=BYTES, host_bytes_s=HOST_BW,
                       write_policy=policy, **kw)  # type: ignore[arg-type]
    return HiRadixCache(100, tiers, events=events)


def test_hbm_eviction_moves_a_prefix_to_host_and_a_hit_loads_it_back() -> None:
    plain = RadixCache(100)
    for p in (A, B):
        plain.insert(p)
    assert plain.match_prefix(A).length == 0  # one tier: evicted = gone
    c = _cache()
    c.insert(A)
    c.insert(B)  # 120 > 100: A (least recent) leaves HBM, its write-through copy stays
    assert (c.size, c.host_size, c.evicted_total) == (60, 120, 60)
    m = c.match_prefix(A)
    assert (m.length, m.host, m.storage) == (60, 60, 0)
    loaded = c.load_back(m, recompute_seconds=1.0)
    assert loaded.length == 60 and loaded.load_seconds == pytest.approx(60 * BYTES / HOST_BW)
    assert c.size == 60 and c.match_prefix(A).host == 0  # A is in HBM again, B went to host
    assert c.match_prefix(B).host == 60
    assert c.counters.load_back_tokens == 60 and c.counters.backup_tokens == 120


def test_write_back_copies_on_eviction_and_loses_what_a_full_host_cannot_take() -> None:
    c = _cache(policy="write_back")
    c.insert(A)
    assert c.host_size == 0  # nothing copied before an eviction
    c.insert(B)
    assert c.host_size == 60 and c.counters.backup_tokens == 60
    assert c.take_stall_seconds() == pytest.approx(60 * BYTES / HOST_BW)  # the blocking D->H copy
    small = _cache(host=50, policy="write_back")
    small.insert(A)
    small.insert(B)  # A does not fit in 50 host tokens: destroyed (host_pressure)
    assert small.counters.dropped == {"host_pressure": 60, "write_through_unbacked_eviction": 0}
    assert small.match_prefix(A).length == 0


def test_write_through_selective_copies_on_the_second_hit() -> None:
    c = _cache(policy="write_through_selective")
    c.insert(A)
    assert c.host_size == 0
    c.match_prefix(A)  # second hit
    assert c.host_size == 60
    c.insert(B)
    c.insert(C)  # B (one hit, no copy) is dropped when HBM evicts it... after A, the older one
    assert c.match_prefix(B).length == 0 and c.match_prefix(A).host == 60
    # SGLang counts write_through_unbacked_eviction under write_through only, in cache mode
    # (_tracks_write_through_unbacked_evictions, unified_radix_cache.py)
    assert c.counters.dropped == {"host_pressure": 0, "write_through_unbacked_eviction": 0}
    wt = _cache(host=50)
    wt.insert(A)  # 60 tokens do not fit a 50-token host pool: no copy
    wt.insert(B)
    assert wt.counters.dropped["write_through_unbacked_eviction"] == 60


def test_a_full_host_pool_evicts_its_lru_and_storage_keeps_what_host_drops() -> None:
    c = _cache(host=120)
    for p in (A, B, C):
        c.insert(p)  # host holds 2 x 60: A's copy is evicted for C's
    assert c.host_size == 120 and c.match_prefix(A).length == 0
    s = _cache(host=120, storage_backend="file", storage_bytes_s=1e8, prefetch_policy="wait_complete")
    for p in (A, B, C):
        s.insert(p)
    m = s.match_prefix(A)
    assert (m.length, m.host, m.storage) == (60, 0, 60)
    loaded = s.load_back(m, recompute_seconds=0.0)
    assert loaded.load_seconds == pytest.approx(60 * BYTES / 1e8 + 60 * BYTES / HOST_BW)
    assert s.counters.storage_hit_tokens == 60 and s.counters.prefetched_tokens == 60


def test_a_storage_prefetch_past_its_deadline_is_unfulfilled_and_computed() -> None:
    slow = _cache(host=120, storage_backend="file", storage_bytes_s=1e3, prefetch_policy="timeout")
    for p in (A, B, C):
        slow.insert(p)
    m = slow.match_prefix(A)
    loaded = slow.load_back(m, recompute_seconds=0.01)  # 60 s at 1 kB/s > SGLang's 1 s + 0.25 s/1k tokens
    assert (loaded.length, loaded.storage) == (0, 0) and slow.counters.storage_unfulfilled == {"deadline": 60}
    best = _cache(host=120, storage_backend="file", storage_bytes_s=1e9, prefetch_policy="best_effort")
    for p in (A, B, C):
        best.insert(p)
    assert best.load_back(best.match_prefix(A), recompute_seconds=1e-9).length == 0  # recomputing is faster


def test_kv_events_carry_the_medium_as_sglang_records_them() -> None:
    rec = KvEventRecorder()
    c = _cache(events=rec)
    rec.take()  # the reset's AllBlocksCleared
    c.insert(A)
    c.insert(B)
    c.load_back(c.match_prefix(A), 1.0)
    events = KvEventBuilder(1).build(rec.take())
    kinds = [(e["type"], e["medium"], e["block_hashes"][0]) for e in events]
    a, b = kinds[0][2], kinds[2][2]
    assert kinds == [
        ("BlockStored", "GPU", a), ("BlockStored", "CPU_PINNED", a),  # A computed, written through
        ("BlockStored", "GPU", b), ("BlockStored", "CPU_PINNED", b),
        ("BlockRemoved", "GPU", a),  # HBM evicts A: it stays in host (same hashes)
        ("BlockStored", "GPU", a),  # loaded back
        ("BlockRemoved", "GPU", b),
    ]


# ---- a worker with HiCache, end to end -------------------------------------------------------------------


def _prompt(i: int, n: int = 400) -> list[int]:
    return [i * 10_000 + t for t in range(n)]


def _generate(url: str, ids: list[int]) -> dict[str, object]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    meta: dict[str, object] = httpx.post(url + "/generate", json=body, timeout=30).json()["meta_info"]
    return meta


def test_a_worker_serves_host_hits_and_sglangs_hicache_series() -> None:
    common = {"time_scale": 0.05, "cache_capacity_tokens": 1000, "speculative": False}
    specs = [WorkerSpec("mixed", **common), WorkerSpec("mixed", hicache_ratio=3.0, **common)]  # type: ignore[arg-type]
    with start_cluster_in_thread(specs) as c:
        plain, tiered = c.urls
        for url in c.urls:
            for i in range(4):  # 4 x 400 tokens > 1,000 in HBM; fits HBM + 3,000 in host
                _generate(url, _prompt(i))
        again = {url: _generate(url, _prompt(0)) for url in c.urls}
        assert again[plain]["cached_tokens"] == 0
        # nothing cached: SGLang's get_cached_tokens_details returns None, so meta_info carries null
        # (the simulator answered {"device": 0, "host": 0})
        assert again[plain]["cached_tokens_details"] is None
        assert again[tiered]["cached_tokens"] == 399
        assert again[tiered]["cached_tokens_details"] == {"device": 0, "host": 399}
        text = httpx.get(tiered + "/metrics").text
        m = parse_metrics(text)
        assert m.get("sglang:hicache_host_total_tokens") == 3000 and m.total("sglang:evicted_tokens_total") > 0
        assert m.get("sglang:hicache_backup_tokens_total") == 4 * 400  # every prompt written through once
        assert 'sglang:load_back_tokens_total{engine_type="unified",model_name="sim-llama-3.1-70b",moe_ep_rank="0",' \
               'pool="kv",pp_rank="0",tp_rank="0"} 399' in text
        assert "sglang:hicache_host_used_tokens" not in httpx.get(plain + "/metrics").text
        # `check servers` reads the simulated worker as a real one
        port = int(tiered.rsplit(":", 1)[1])
        profile = validate_profile_data({
            "name": "t", "collocated": True,
            "nodes": [{"name": "n1", "host": "127.0.0.1", "roles": ["prefill"], "overrides": {"extra_args": []}}],
            "models": {"target": {"path": "/m"}},
            "sglang": {"collocated": {"port": port}, "hicache": {"ratio": 3.0}},
        })  # fmt: skip
        found = {f.check: (f.status.value, f.message) for f in hicache_findings(profile, instances(profile))}
        assert found["servers.hicache_host"][0] == "ok" and "of 3,000 tokens" in found["servers.hicache_host"][1]
        assert found["servers.hicache_backup"][0] == "ok"


def test_the_profile_gives_its_servers_their_tiers() -> None:
    profile = validate_profile_data({
        "name": "t",
        "nodes": [{"name": "pf", "host": "10.0.0.1", "roles": ["prefill"]},
                  {"name": "dc", "host": "10.0.0.2", "roles": ["decode"]}],
        "models": {"target": {"path": "/m", "preset": "llama-3.1-70b"}},
        "sglang": {"hicache": {"write_policy": "write_back", "storage": {"backend": "file", "prefetch_policy": "best_effort"}},
                   "extra_args": {"prefill": ["--page-size", "64"], "decode": ["--page-size", "64"]}},
    })  # fmt: skip
    pre, dec = specs_from_profile(profile)
    assert (pre.hicache_ratio, pre.hicache_write_policy, pre.hicache_storage_backend, pre.hicache_prefetch_policy) == (
        2.0, "write_back", "file", "best_effort")  # SGLang's default ratio where the profile auto-sizes
    assert not dec.hicache and dec.tier_config(dec.timing()) is None
    cfg = pre.tier_config(pre.timing())
    assert cfg is not None and cfg.host_capacity_tokens == 2 * pre.timing().kv_capacity_tokens
    with pytest.raises(ValueError, match="hicache_write_policy must be one of"):
        WorkerSpec("prefill", hicache_ratio=2.0, hicache_write_policy="write_around")  # type: ignore[arg-type]


# ---- buffer_only host memory ------------------------------------------------------------------------------


def test_buffer_only_keeps_nothing_in_host_and_serves_hits_from_storage() -> None:
    c = _cache(host=100, storage_backend="file", prefetch_policy="wait_complete", host_memory_mode="buffer_only",
               policy="write_back")  # fmt: skip
    assert c.tiers.write_policy == "write_through"  # SGLang resolves write_back so in buffer_only
    for p in (A, B):
        c.insert(p)  # 120 > 100 in HBM: A leaves it, kept in storage only
    assert c.host_size == 0 and c.storage_size == 120 and c.counters.storage_backup_tokens == 120
    m = c.match_prefix(A)
    assert (m.length, m.host, m.storage) == (60, 0, 60)
    c.load_back(m, recompute_seconds=1.0)
    assert c.host_size == 0 and c.match_prefix(A).storage == 0  # loaded through the buffer into HBM
    small = _cache(host=50, storage_backend="file", host_memory_mode="buffer_only")
    small.insert(A)  # a 60-token span does not fit the 50-token staging buffer: it never reaches storage
    assert small.counters.backup_dropped_tokens == 60 and small.storage_size == 0
    fams = {f.name: f for f in tier_families(small, {})}
    assert "sglang:hicache_backup_dropped_tokens_total" in fams
    assert "sglang:hicache_backup_dropped_tokens_total" not in {f.name for f in tier_families(_cache(), {})}


def test_buffer_only_needs_storage_and_is_refused_on_decodes_as_sglang_refuses_it() -> None:
    with pytest.raises(ValueError, match="buffer_only requires a storage backend"):
        WorkerSpec("prefill", hicache_ratio=1.2, hicache_host_memory_mode="buffer_only")
    with pytest.raises(ValueError, match="not supported on decode instances"):
        WorkerSpec("decode", decode_radix_cache=True, hicache_ratio=1.2, hicache_storage_backend="file",
                   hicache_host_memory_mode="buffer_only")
    profile = validate_profile_data({
        "name": "t",
        "nodes": [{"name": "pf", "host": "10.0.0.1", "roles": ["prefill"]},
                  {"name": "dc", "host": "10.0.0.2", "roles": ["decode"]}],
        "models": {"target": {"path": "/m", "preset": "llama-3.1-70b"}},
        "sglang": {"hicache": {"host_memory_mode": "buffer_only", "storage": {"backend": "file"}},
                   "extra_args": {"prefill": ["--page-size", "64"], "decode": ["--page-size", "64"]}},
    })  # fmt: skip
    pre, _ = specs_from_profile(profile)
    assert (pre.hicache_host_memory_mode, pre.hicache_ratio) == ("buffer_only", 1.2)  # SGLang's buffer_only default


def test_a_buffer_only_worker_serves_storage_hits_and_check_servers_reads_its_dropped_backups() -> None:
    common = {"time_scale": 0.05, "cache_capacity_tokens": 1000, "speculative": False, "hicache_storage_backend": "file",
              "hicache_host_memory_mode": "buffer_only", "hicache_prefetch_policy": "wait_complete"}
    specs = [WorkerSpec("mixed", hicache_ratio=1.2, **common),  # type: ignore[arg-type]
             WorkerSpec("mixed", hicache_ratio=0.1, **common)]  # type: ignore[arg-type]  # staging < one prompt
    with start_cluster_in_thread(specs) as c:
        ok, starved = c.urls
        for url in c.urls:
            for i in range(4):
                _generate(url, _prompt(i))
        assert _generate(ok, _prompt(0))["cached_tokens_details"] == {"device": 0, "host": 0, "storage": 399,
                                                                        "storage_backend": "HiCacheFile"}
        m = parse_metrics(httpx.get(ok + "/metrics").text)
        assert m.get("sglang:hicache_host_used_tokens") == 0 and m.total("sglang:hicache_backup_dropped_tokens_total") == 0
        port = int(starved.rsplit(":", 1)[1])
        profile = validate_profile_data({
            "name": "t", "collocated": True,
            "nodes": [{"name": "n1", "host": "127.0.0.1", "roles": ["prefill"], "overrides": {"extra_args": []}}],
            "models": {"target": {"path": "/m"}},
            "sglang": {"collocated": {"port": port}, "extra_args": {"collocated": ["--page-size", "64"]},
                       "hicache": {"ratio": 0.1, "host_memory_mode": "buffer_only", "storage": {"backend": "file"}}},
        })  # fmt: skip
        found = {f.check: (f.status.value, f.message) for f in hicache_findings(profile, instances(profile))}
        status, message = found["servers.hicache_backup"]
        assert status == "warn" and message.startswith("1,600 buffer_only backup tokens never reached storage"), message


# ---- accounting under random load -------------------------------------------------------------------
# A storage-only prefix computed again went back to HBM without a host copy; evicted again it became
# storage-only above children still in host memory, and load_back (which takes the host part of a path
# to come first) then loaded a host child twice and its storage-only parent never: `size` and
# `host_size` drifted from the tree (seeds 5, 10, 19, ... below), so host used / total and HBM usage
# were wrong.


def _nodes(c: HiRadixCache) -> list:  # type: ignore[type-arg]
    out, stack = [], [c.root]
    while stack:
        n = stack.pop()
        for child in n.children.values():
            assert child.parent is n
            out.append(child)
            stack.append(child)
    return out


def _assert_consistent(c: HiRadixCache, where: str) -> None:
    nodes = _nodes(c)
    assert c.size == sum(len(n.key) for n in nodes if n.on_device), where
    assert c.host_size == sum(len(n.key) for n in nodes if n.on_host), where
    assert c.storage_size == sum(len(n.key) for n in nodes if n.on_storage), where
    assert 0 <= c.host_size <= c.host_capacity, where
    cap = c.tiers.storage_capacity_tokens
    assert cap is None or c.storage_size <= cap, where
    for n in nodes:
        assert n.on_device or n.on_host or n.on_storage, where
        p = n.parent
        if p is not c.root:
            assert not n.on_device or p.on_device, f"{where}: device part not a prefix"
            assert not (n.on_device or n.on_host) or p.on_device or p.on_host, f"{where}: device-or-host not a prefix"


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
@pytest.mark.parametrize(("mode", "storage_cap"), [("cache", None), ("cache", 40), ("buffer_only", 40)])
def test_tier_sizes_match_the_tree_under_random_load(policy: WritePolicy, mode: str, storage_cap: int | None) -> None:
    import random

    for seed in range(40):
        r = random.Random(seed)
        tiers = TierConfig(host_capacity_tokens=r.choice([8, 20, 64]), kv_bytes_per_token=100, host_bytes_s=1e9,
                           write_policy=policy, storage_backend="file", storage_capacity_tokens=storage_cap,
                           host_memory_mode=mode,  # type: ignore[arg-type]
                           prefetch_policy=r.choice(["timeout", "wait_complete", "best_effort"]))  # type: ignore[arg-type]
        c = HiRadixCache(r.choice([16, 32]), tiers, page_size=r.choice([1, 4]))
        prefixes = [[r.randrange(5) for _ in range(r.randrange(1, 24))] for _ in range(6)]
        held = []
        for step in range(300):
            op = r.random()
            tokens = r.choice(prefixes) + [r.randrange(5) for _ in range(r.randrange(0, 12))]
            where = f"{policy} {mode} seed {seed} step {step}"
            if op < 0.45:  # a request: match, load what is below HBM, hold it while it runs, insert
                m = c.match_prefix(tokens)
                if m.host or m.storage:
                    m = c.load_back(m, r.choice([0.0, 1e-6, 10.0]))
                _assert_consistent(c, where + " load_back")
                c.lock(m.node)
                held.append(m.node)
                if len(held) > 3 or r.random() < 0.5:
                    c.unlock(held.pop(0))
                c.insert(tokens)
            elif op < 0.9:
                c.insert(tokens)
            elif op < 0.95:
                c.detach_storage()
            else:
                c.attach_storage("file")
            _assert_consistent(c, where)


def test_storage_series_are_sglangs_with_every_precreated_reason() -> None:
    # the simulator exposed only reason="deadline", no sglang:storage_prefetch_deferred_tokens_total, and
    # the backup-dropped counter only in buffer_only; SGLang creates all of them when storage attaches
    fams = {f.name: f for f in tier_families(_cache(storage_backend="file"), {"tp_rank": "0"})}
    reasons = {name: [labels["reason"] for labels, _ in fams[name].samples]
               for name in ("sglang:storage_prefetch_unfulfilled_tokens_total",
                            "sglang:storage_prefetch_deferred_tokens_total")}  # fmt: skip
    assert reasons["sglang:storage_prefetch_unfulfilled_tokens_total"] == list(UNFULFILLED_REASONS)
    assert reasons["sglang:storage_prefetch_deferred_tokens_total"] == list(DEFERRED_REASONS)
    assert fams["sglang:hicache_backup_dropped_tokens_total"].samples == [
        ({"tp_rank": "0", "storage_backend": "file"}, 0)]
    assert all(fams[n].type == "counter" for n in fams if n.endswith("_total"))


@pytest.mark.sglang
def test_the_precreated_reasons_are_read_from_sglangs_collector() -> None:
    import importlib.util
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang not installed")
    text = (Path(next(iter(spec.submodule_search_locations))) / "srt/observability/metrics_collector.py").read_text()

    def reasons_after(name: str) -> tuple[str, ...]:
        tail = text.split(f'name="{name}"', 1)[1]
        loop = re.search(r"for reason in \(([^)]*)\)", tail)
        assert loop is not None
        return tuple(re.findall(r'"([a-z_]+)"', loop.group(1)))

    assert reasons_after("sglang:storage_prefetch_unfulfilled_tokens_total") == UNFULFILLED_REASONS
    assert reasons_after("sglang:storage_prefetch_deferred_tokens_total") == DEFERRED_REASONS
