"""The simulator's runtime storage-backend endpoints (SGLang 0.5.23's `GET` / `PUT` / `DELETE
/hicache/storage-backend`, `POST /hicache/storage-backend/clear`, sglang/srt/entrypoints/http_server.py):
their bodies and admin-key behaviour, a detach that really stops storage hits and backups, and
`check servers` reading a detached simulated worker."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

import httpx
import pytest

from infer_ctl.checks.hicache import hicache_findings
from infer_ctl.core.sglang import instances
from infer_ctl.core.sglang.hicache_health import parse_metrics
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.tiers import HiRadixCache, TierConfig

KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}
EP = "/hicache/storage-backend"
A, B, C = (list(range(k, k + 60)) for k in (1000, 2000, 3000))


def _prompt(i: int, n: int = 400) -> list[int]:
    return [i * 10_000 + t for t in range(n)]


def _details(url: str, ids: list[int]) -> Any:
    """meta_info's cached_tokens_details: a dict, or None (null) when nothing was cached, as SGLang's."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}
    meta: dict[str, Any] = httpx.post(url + "/generate", json=body, timeout=30).json()["meta_info"]
    return meta["cached_tokens_details"]


def _spec(**kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {"time_scale": 0.05, "cache_capacity_tokens": 1000, "speculative": False,
                            "hicache_ratio": 1.0, "hicache_storage_backend": "file",
                            "hicache_prefetch_policy": "wait_complete", "admin_api_key": KEY}  # fmt: skip
    return WorkerSpec("mixed", **{**base, **kw})


def test_detach_forgets_what_only_storage_held_and_stops_writing_to_it() -> None:
    c = HiRadixCache(100, TierConfig(host_capacity_tokens=60, kv_bytes_per_token=1, host_bytes_s=1e9,
                                     storage_backend="file", prefetch_policy="wait_complete"))  # fmt: skip
    for p in (A, B, C):
        c.insert(p)  # a 60-token host pool: A ends up in storage only
    m = c.match_prefix(A)
    assert (m.length, m.host, m.storage) == (60, 0, 60) and c.storage_size > 0
    c.detach_storage()
    assert c.match_prefix(A).length == 0 and c.storage_size == 0  # nothing can find A now
    assert c.match_prefix(C).length == 60  # device and host copies stay
    backed = c.counters.storage_backup_tokens
    c.insert(list(range(4000, 4060)))
    assert c.counters.storage_backup_tokens == backed and c.storage_size == 0  # no writes to storage
    assert c.storage_label == "file"  # the series stay (frozen), as SGLang's collector stays registered
    c.attach_storage("file", prefetch_policy="timeout")
    c.insert(list(range(5000, 5060)))
    assert c.counters.storage_backup_tokens == backed + 60 and c.tiers.prefetch_policy == "timeout"


def test_a_detached_worker_serves_no_storage_hits_while_its_twin_does() -> None:
    with start_cluster_in_thread([_spec(), _spec()]) as cluster:
        kept, detached = cluster.urls
        for url in cluster.urls:
            for i in range(6):  # 6 x 400 tokens: HBM 1,000 + host 1,000, the rest in storage only
                _details(url, _prompt(i))
        r = httpx.delete(detached + EP, headers=AUTH)
        assert (r.status_code, r.text) == (200, "HiCache storage backend detached.\n"
                                                 "Detached HiCache storage backend successfully.\n")
        assert _details(kept, _prompt(0)) == {"device": 0, "host": 0, "storage": 399, "storage_backend": "HiCacheFile"}
        assert _details(detached, _prompt(0)) is None  # recomputed, nothing cached: SGLang's null
        m = parse_metrics(httpx.get(detached + "/metrics").text)
        assert m.total("sglang:storage_prefetch_hit_tokens_total") == 0  # the series is there, and did not move
        assert "sglang:storage_prefetch_hit_tokens_total" in m.values
        assert httpx.get(detached + EP, headers=AUTH).json() == {
            "hicache_storage_backend": None, "hicache_storage_backend_extra_config": None,
            "hicache_storage_prefetch_policy": "wait_complete", "hicache_write_policy": "write_through"}
        # re-attached: storage is written again (an empty view: what it held before is not found again)
        r = httpx.put(detached + EP, headers=AUTH, json={"hicache_storage_backend": "file",
                                                         "hicache_storage_prefetch_policy": "wait_complete"})
        assert (r.status_code, r.text) == (200, "HiCache storage backend attached.\n"
                                                 "Attached HiCache storage backend successfully.\n")
        for i in range(6, 12):
            _details(detached, _prompt(i))
        assert _details(detached, _prompt(6))["storage"] == 399


def test_admin_key_and_request_shapes_as_sglang_answers_them() -> None:
    with start_cluster_in_thread([_spec(), _spec(admin_api_key=None), _spec(hicache_ratio=None,
                                                                           hicache_storage_backend=None)]) as cluster:
        keyed, keyless, plain = cluster.urls
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            for method in ("GET", "PUT", "DELETE"):
                r = httpx.request(method, keyed + EP, headers=headers, json={"hicache_storage_backend": "file"})
                assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), (method, headers)
        assert httpx.get(keyed + EP, headers={"Authorization": f"bearer {KEY}"}).status_code == 200
        for method in ("GET", "PUT", "DELETE"):  # a server without --admin-api-key refuses the admin endpoints
            r = httpx.request(method, keyless + EP, json={"hicache_storage_backend": "file"})
            assert r.status_code == 400 and "requires admin API key" in r.json()["error"], method
        assert httpx.post(keyless + EP + "/clear").text == "Hierarchical cache storage backend cleared.\n"
        r = httpx.put(keyed + EP, headers=AUTH, json={"hicache_storage_backend": "mooncake"})
        assert (r.status_code, r.text) == (400, "Failed to attach HiCache storage backend.\nHiCache storage backend is "
                                                "already enabled with backend 'file'. Cannot attach different backend "
                                                "'mooncake'. Detach first.\n")  # fmt: skip
        r = httpx.put(keyed + EP, headers=AUTH, json={"hicache_storage_backend": "file", "hicache_write_policy": "wb"})
        assert r.status_code == 400 and "Invalid hicache_write_policy: 'wb'" in r.text
        r = httpx.put(keyed + EP, headers=AUTH, json={"hicache_storage_backend": "file",
                                                      "hicache_storage_prefetch_policy": "timeout"})
        assert r.text.endswith("already enabled with same backend; policies updated.\n")
        assert httpx.get(keyed + EP, headers=AUTH).json()["hicache_storage_prefetch_policy"] == "timeout"
        r = httpx.put(keyed + EP, headers=AUTH, json={"hicache_storage_prefetch_policy": "timeout"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "hicache_storage_backend"]
        r = httpx.put(plain + EP, json={"hicache_storage_backend": "file"}, headers=AUTH)
        assert r.status_code == 400 and "Hierarchical cache is not enabled." in r.text


def test_attach_and_detach_wait_for_an_idle_scheduler() -> None:
    with start_cluster_in_thread([_spec(time_scale=1.0)]) as cluster:
        url = cluster.urls[0]
        done = threading.Event()

        def long_request() -> None:
            body = {"input_ids": _prompt(0), "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True}}
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(url + "/generate", json=body, timeout=60)
            done.set()

        threading.Thread(target=long_request, daemon=True).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "#running-req: 1" not in _flush_text(url):
            time.sleep(0.02)
        r = httpx.delete(url + EP, headers=AUTH)
        assert (r.status_code, r.text) == (400, "Failed to detach HiCache storage backend.\nReject detach: scheduler "
                                                "is not idle. #queue-req=0 #running-req=1\n")  # fmt: skip
        assert httpx.get(url + EP, headers=AUTH).json()["hicache_storage_backend"] == "file"


def _flush_text(url: str) -> str:
    """POST /flush_cache names the running requests while it refuses (and flushes nothing then)."""
    return httpx.post(url + "/flush_cache").text


def test_check_servers_fails_a_simulated_server_whose_storage_backend_was_detached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SIM_ADMIN_KEY", KEY)
    with start_cluster_in_thread([_spec()]) as cluster:
        url = cluster.urls[0]
        profile = validate_profile_data({
            "name": "t", "collocated": True,
            "nodes": [{"name": "n1", "host": "127.0.0.1", "roles": ["prefill"], "overrides": {"extra_args": []}}],
            "models": {"target": {"path": "/m"}},
            "sglang": {"collocated": {"port": int(url.rsplit(":", 1)[1])},
                       "extra_args": {"collocated": ["--page-size", "64"]},
                       "hicache": {"ratio": 1.0, "storage": {"backend": "file", "prefetch_policy": "wait_complete"},
                                   "admin_api_key_env": "TEST_SIM_ADMIN_KEY"}},
        })  # fmt: skip

        def storage() -> tuple[str, str, str | None]:
            found = [f for f in hicache_findings(profile, instances(profile)) if f.check == "servers.hicache_storage"]
            assert len(found) == 1
            return found[0].status.value, found[0].message, found[0].remedy

        assert storage()[:2] == ("ok", "storage file attached; 0 storage-hit tokens")
        assert httpx.delete(url + EP, headers=AUTH).status_code == 200
        status, message, remedy = storage()
        assert (status, message) == ("fail", "storage backend detached at runtime (the profile runs file): no L3 "
                                             "reads or writes")
        body = {"hicache_storage_backend": "file", "hicache_storage_prefetch_policy": "wait_complete",
                "hicache_write_policy": "write_through"}
        assert remedy is not None and f"-d '{json.dumps(body)}'" in remedy and "$TEST_SIM_ADMIN_KEY" in remedy
        # the remedy's request, as given, re-attaches it
        assert httpx.put(url + EP, headers=AUTH, json=body).status_code == 200
        assert storage()[0] == "ok"
        # a runtime attach that changed a policy is drift from the launch flags
        httpx.put(url + EP, headers=AUTH, json={"hicache_storage_backend": "file",
                                                "hicache_storage_prefetch_policy": "timeout"})
        assert storage()[:2] == ("warn", "storage file attached, but a runtime attach changed "
                                         "hicache_storage_prefetch_policy timeout (launched with wait_complete)")
