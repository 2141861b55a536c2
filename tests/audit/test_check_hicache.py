"""`check servers`' HiCache findings against a real HTTP server on loopback that serves SGLang 0.5.23's
HiCache series (written by prometheus_client with SGLang's names, label sets and counter suffixes, as
sglang/srt/observability/metrics_collector.py registers them) and its `/hicache/storage-backend`
endpoint with SGLang's admin-key behaviour (sglang/srt/entrypoints/http_server.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from infer_ctl.checks.hicache import hicache_findings
from infer_ctl.core.sglang import instances
from infer_ctl.core.sglang.hicache_health import parse_metrics
from infer_ctl.profile import Profile
from infer_ctl.profile.load import validate_profile_data

SCHED = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank")
RADIX = ("cache_type", "tp_rank", "pp_rank", "dp_rank")
STORE = ("storage_backend", "tp_rank", "dp_rank", "pp_rank", "pp_size", "attn_cp_rank", "attn_cp_size")


@dataclass
class Sglang:
    """What one server's ranks report (per TP rank the same logical counts, as SGLang's do)."""

    tp: int = 2
    host_used: int = 1000
    host_total: int = 10_000
    evicted: int = 0
    backup: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    backup_dropped: int = 0
    hit: int = 0
    unfulfilled: dict[str, int] = field(default_factory=dict)
    backend: str | None = "file"  # what GET /hicache/storage-backend says is attached
    admin_key: str | None = "s3cret"  # the server's --admin-api-key
    raw_metrics: bytes | None = None  # served instead of metrics() (a hostile or broken exposition)
    raw_storage: tuple[int, bytes] | None = None  # served instead of the storage endpoint's answer

    def metrics(self) -> bytes:
        reg = CollectorRegistry()
        used = Gauge("sglang:hicache_host_used_tokens", "", SCHED, registry=reg)
        total = Gauge("sglang:hicache_host_total_tokens", "", SCHED, registry=reg)
        evicted = Counter("sglang:evicted_tokens", "", RADIX, registry=reg)
        backup = Counter("sglang:hicache_backup_tokens", "", (*RADIX, "pool"), registry=reg)
        dropped = Counter("sglang:hicache_dropped_tokens", "", (*RADIX, "reason", "pool"), registry=reg)
        bdropped = Counter("sglang:hicache_backup_dropped_tokens", "", STORE, registry=reg)
        hit = Counter("sglang:storage_prefetch_hit_tokens", "", STORE, registry=reg)
        unf = Counter("sglang:storage_prefetch_unfulfilled_tokens", "", (*STORE, "reason"), registry=reg)
        Counter("sglang:prefetched_tokens", "", STORE, registry=reg)
        for tp in range(self.tp):
            sched = {"model_name": "m", "engine_type": "prefill", "tp_rank": str(tp), "pp_rank": "0",
                     "moe_ep_rank": "0", "dp_rank": "0"}  # fmt: skip
            radix = {"cache_type": "HiRadixCache", "tp_rank": str(tp), "pp_rank": "0", "dp_rank": "0"}
            store = {"storage_backend": "file", "tp_rank": str(tp), "dp_rank": "0", "pp_rank": "0", "pp_size": "1",
                     "attn_cp_rank": "0", "attn_cp_size": "1"}  # fmt: skip
            used.labels(**sched).set(self.host_used)
            total.labels(**sched).set(self.host_total)
            evicted.labels(**radix).inc(self.evicted)
            backup.labels(**radix, pool="kv").inc(self.backup)
            for reason in ("host_pressure", "write_through_unbacked_eviction"):
                dropped.labels(**radix, reason=reason, pool="kv").inc(self.dropped.get(reason, 0))
            bdropped.labels(**store).inc(self.backup_dropped)
            hit.labels(**store).inc(self.hit)
            for reason in ("deadline", "host_capacity", "storage_transfer", "dropped"):
                unf.labels(**store, reason=reason).inc(self.unfulfilled.get(reason, 0))
        return generate_latest(reg)


class _Server:
    def __init__(self) -> None:
        self.state = Sglang()
        self.seen_auth: list[str | None] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                s = outer.state
                if self.path == "/metrics":
                    body = s.raw_metrics if s.raw_metrics is not None else s.metrics()
                    return self._send(200, body, "text/plain; version=0.0.4")
                if self.path == "/hicache/storage-backend":
                    auth = self.headers.get("Authorization")
                    outer.seen_auth.append(auth)
                    if s.raw_storage is not None:
                        return self._send(s.raw_storage[0], s.raw_storage[1], "text/html")
                    if not s.admin_key:  # _admin_api_key_missing_response
                        err = {"error": "This endpoint requires admin API key, but this server was started "
                               "without one (admin-api-key). Restart with --admin-api-key to enable."}
                        return self._send(400, json.dumps(err).encode(), "application/json")
                    if auth != f"Bearer {s.admin_key}":
                        return self._send(401, b'{"error": "Unauthorized"}', "application/json")
                    body = {"hicache_storage_backend": s.backend, "hicache_storage_backend_extra_config": None,
                            "hicache_storage_prefetch_policy": "timeout", "hicache_write_policy": "write_through"}
                    return self._send(200, json.dumps(body).encode(), "application/json")
                return self._send(404, b"", "text/plain")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def _profile(port: int, hicache: dict[str, Any]) -> Profile:
    return validate_profile_data({
        "name": "hc",
        "nodes": [{"name": "pf-01", "host": "127.0.0.1", "roles": ["prefill"], "overrides": {"prefill_port": port}},
                  {"name": "dc-01", "host": "127.0.0.2", "roles": ["decode"]}],
        "models": {"target": {"path": "/m", "tp": 2}},
        "sglang": {"hicache": hicache, "extra_args": {"prefill": ["--page-size", "64"], "decode": ["--page-size", "64"]}},
    })  # fmt: skip


STORAGE = {"storage": {"backend": "file"}, "admin_api_key_env": "TEST_SGLANG_ADMIN_KEY"}


def _found(server: _Server, hicache: dict[str, Any]) -> dict[str, tuple[str, str]]:
    p = _profile(server.port, hicache)
    prefill = [i for i in instances(p) if i.role == "prefill"]
    return {f.check: (f.status.value, f.message) for f in hicache_findings(p, prefill)}


@pytest.fixture(autouse=True)
def _admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SGLANG_ADMIN_KEY", "s3cret")


def test_a_healthy_tier_is_ok(server: _Server) -> None:
    server.state = Sglang(evicted=5000, backup=5000, hit=2000, unfulfilled={"deadline": 100})
    found = _found(server, STORAGE)
    assert found == {
        "servers.hicache_host": ("ok", "host pool 10% full (1,000 of 10,000 tokens)"),
        "servers.hicache_backup": ("ok", "no backup losses (5,000 tokens backed up to host, 5,000 evicted)"),
        "servers.hicache_storage": ("ok", "storage file attached; 2,000 storage-hit tokens, 5% unfulfilled"),
    }
    assert server.seen_auth == ["Bearer s3cret"]  # the key from admin_api_key_env, as a bearer token


def test_host_pool_full_and_evicting_warns(server: _Server) -> None:
    server.state = Sglang(host_used=9_900, evicted=40_000, backup=40_000)
    status, message = _found(server, {})["servers.hicache_host"]
    assert status == "warn" and message.startswith("host pool 99% full (9,900 of 10,000 tokens) while HBM evicts "
                                                   "(40,000 tokens evicted so far)")
    server.state = Sglang(host_used=9_900, evicted=0)  # full but nothing evicts: it just holds what it has
    assert _found(server, {})["servers.hicache_host"][0] == "ok"


def test_write_back_losses_warn_then_fail(server: _Server) -> None:
    server.state = Sglang(evicted=10_000, backup=9_800, dropped={"host_pressure": 200})
    status, message = _found(server, {"write_policy": "write_back"})["servers.hicache_backup"]
    assert status == "warn" and message == ("200 tokens evicted from HBM without a host copy under write_back because "
                                            "the host pool was full (write-back losses) (2% of the 10,000 evicted)")
    server.state = Sglang(evicted=10_000, backup=7_000, dropped={"host_pressure": 2_500,
                                                                  "write_through_unbacked_eviction": 500})
    status, message = _found(server, {"write_policy": "write_back"})["servers.hicache_backup"]
    assert status == "fail" and "(30% of the 10,000 evicted)" in message and "write-through copy" in message


def test_buffer_backups_dropped_warn(server: _Server) -> None:
    server.state = Sglang(backup_dropped=640)
    hc = {**STORAGE, "host_memory_mode": "buffer_only"}
    status, message = _found(server, hc)["servers.hicache_backup"]
    assert status == "warn" and message.startswith("640 buffer_only backup tokens never reached storage")


def test_a_detached_storage_backend_fails(server: _Server) -> None:
    server.state = Sglang(backend=None)
    status, message = _found(server, STORAGE)["servers.hicache_storage"]
    assert status == "fail" and message == ("storage backend detached at runtime (the profile runs file): no L3 "
                                            "reads or writes")


def test_failing_prefetches_warn_with_their_reasons(server: _Server) -> None:
    server.state = Sglang(hit=10_000, unfulfilled={"deadline": 6_000, "storage_transfer": 1_000})
    status, message = _found(server, STORAGE)["servers.hicache_storage"]
    assert status == "warn" and message == ("storage prefetches failing: 70% of 10,000 storage-hit tokens never "
                                            "became usable (deadline 6,000, storage_transfer 1,000)")


def test_runtime_state_unreadable_without_or_with_a_wrong_key(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    server.state = Sglang(admin_key=None, hit=100)  # the server runs without --admin-api-key: metrics only
    status, message = _found(server, STORAGE)["servers.hicache_storage"]
    assert (status, message) == ("ok", "storage file (runtime state not read); 100 storage-hit tokens, 0% unfulfilled; "
                                 "runtime state not read: the server runs without --admin-api-key, so SGLang does "
                                 "not answer it")
    server.state = Sglang(hit=100)
    monkeypatch.setenv("TEST_SGLANG_ADMIN_KEY", "wrong")
    assert _found(server, STORAGE)["servers.hicache_storage"] == (
        "unknown", "/hicache/storage-backend: HTTP 401, the admin key was refused")


def test_a_server_without_hicache_metrics_is_unknown_and_servers_without_hicache_are_not_read(server: _Server) -> None:
    p = _profile(server.port, {})
    assert hicache_findings(p, [i for i in instances(p) if i.role == "decode"]) == []  # no HiCache on decodes
    server.state = Sglang(host_total=0)
    assert _found(server, {})["servers.hicache_host"][0] == "unknown"


def test_parse_reads_one_tp_rank_and_sums_dp_ranks() -> None:
    text = "\n".join([
        '# TYPE sglang:evicted_tokens_total counter',
        'sglang:evicted_tokens_total{cache_type="x",dp_rank="0",pp_rank="0",tp_rank="1"} 7.0',
        'sglang:evicted_tokens_total{cache_type="x",dp_rank="0",pp_rank="0",tp_rank="0"} 5.0',
        'sglang:evicted_tokens_total{cache_type="x",dp_rank="1",pp_rank="0",tp_rank="0"} 3.0',
        'sglang:evicted_tokens_created{cache_type="x",dp_rank="1",pp_rank="0",tp_rank="0"} 1.7e9',
        'sglang:hicache_dropped_tokens_total{dp_rank="0",pool="kv",reason="host_pressure",tp_rank="0"} 2.0',
    ])  # fmt: skip
    m = parse_metrics(text)
    assert m.total("sglang:evicted_tokens_total") == 8.0
    assert m.by_reason["sglang:hicache_dropped_tokens_total"] == {"host_pressure": 2.0}


def test_an_unset_key_variable_is_named_and_a_detach_remedy_is_the_attach_request(
        server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_SGLANG_ADMIN_KEY")
    server.state = Sglang()
    found = hicache_findings(_profile(server.port, STORAGE), [i for i in instances(_profile(server.port, STORAGE))
                                                              if i.role == "prefill"])
    storage = next(f for f in found if f.check == "servers.hicache_storage")
    assert (storage.status.value, storage.message) == (
        "unknown", "/hicache/storage-backend: HTTP 401: $TEST_SGLANG_ADMIN_KEY is not set in this environment")
    assert server.seen_auth == [None]
    monkeypatch.setenv("TEST_SGLANG_ADMIN_KEY", "s3cret")
    server.state = Sglang(backend=None)
    hc = {**STORAGE, "storage": {"backend": "file", "extra_config": {"file_path": "/x"}}, "write_policy": "write_back"}
    p = _profile(server.port, hc)
    storage = next(f for f in hicache_findings(p, [i for i in instances(p) if i.role == "prefill"])
                   if f.check == "servers.hicache_storage")
    assert storage.status.value == "fail" and storage.remedy is not None
    assert storage.remedy.startswith(f"re-attach it when no request is running (SGLang refuses otherwise): curl -X PUT "
                                     f"http://127.0.0.1:{server.port}/hicache/storage-backend -H 'Authorization: Bearer "
                                     "$TEST_SGLANG_ADMIN_KEY'")
    assert ('"hicache_storage_backend_extra_config_json": "{\\"file_path\\":\\"/x\\"}", '
            '"hicache_storage_prefetch_policy": "timeout", "hicache_write_policy": "write_back"}') in storage.remedy


# ---- hostile /metrics and runtime answers: NaN / Inf / negative samples crashed
# `check servers` (int(nan) in the finding's details) or were judged as counts ------------------------------


def _exposition(**samples: str) -> bytes:
    names = {"used": "sglang:hicache_host_used_tokens", "total": "sglang:hicache_host_total_tokens",
             "evicted": "sglang:evicted_tokens_total", "backup": "sglang:hicache_backup_tokens_total",
             "hit": "sglang:storage_prefetch_hit_tokens_total"}  # fmt: skip
    lines = [f'{names[k]}{{tp_rank="0",dp_rank="0"}} {v}' for k, v in samples.items()]
    lines.append('sglang:hicache_dropped_tokens_total{tp_rank="0",dp_rank="0",reason="host_pressure",pool="kv"} '
                 + samples.get("dropped", "0"))
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(("samples", "check", "shown"), [
    ({"used": "NaN", "total": "100"}, "servers.hicache_host", "sglang:hicache_host_used_tokens = NaN"),
    ({"used": "5", "total": "+Inf"}, "servers.hicache_host", "sglang:hicache_host_total_tokens = +Inf"),
    ({"used": "-5", "total": "100"}, "servers.hicache_host", "sglang:hicache_host_used_tokens = -5"),
    ({"used": "5", "total": "100", "evicted": "NaN"}, "servers.hicache_backup", "sglang:evicted_tokens_total = NaN"),
    ({"used": "5", "total": "100", "hit": "-Inf"}, "servers.hicache_storage",
     "sglang:storage_prefetch_hit_tokens_total = -Inf"),
])
def test_a_nan_inf_or_negative_sample_is_unknown_naming_the_series(
        server: _Server, samples: dict[str, str], check: str, shown: str) -> None:
    server.state = Sglang(raw_metrics=_exposition(**samples))
    status, message = _found(server, STORAGE)[check]
    assert status == "unknown" and shown in message, message


def test_used_above_total_is_unknown_not_a_full_pool(server: _Server) -> None:
    server.state = Sglang(raw_metrics=_exposition(used="500", total="100", evicted="10"))
    status, message = _found(server, STORAGE)["servers.hicache_host"]
    assert status == "unknown" and "exceeds" in message, message


def test_a_garbage_metrics_body_and_an_html_storage_answer_do_not_crash(server: _Server) -> None:
    garbage = b"\xff\xfe{{{\nsglang:hicache_host_used_tokens{tp_rank=\"0\" 12\n}}} x\n" + b"a" * 200_000 + b"\n"
    server.state = Sglang(raw_metrics=garbage, raw_storage=(500, b"<html>Internal Server Error</html>"))
    found = _found(server, STORAGE)
    assert found["servers.hicache_host"][0] == "unknown"
    assert found["servers.hicache_storage"][0] == "ok" and "runtime state not read" in found["servers.hicache_storage"][1]
