"""Tenants at the router, end to end: simulated SGLang workers (real PD bootstrap) behind the real router,
tenants identified by API key (or header), their limits under bounded load, their token counts against
the workers' own usage fields, their cost, and what the workers receive (a recording stand-in)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.errors import UsageError
from infer_ctl.profile.load import parse_profile_text
from infer_ctl.router.config import from_profile
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.router.observe.tenants import TenantSpec, key_digest
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_specs
from tests.router.observe.test_tracing_otlp import recording  # noqa: F401 - the header-recording stand-ins

KEY_A, KEY_B = "key-a-0123456789abcdef01234567", "key-b-0123456789abcdef01234567"
BODY = {"text": "tenant test " * 8, "sampling_params": {"max_new_tokens": 4}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread(pd_specs(1, 1))
    yield c
    c.stop()


def _router(cluster: ThreadedSimCluster, tenants: list[TenantSpec], **kw: Any) -> Any:
    pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
    return start_router_in_thread(router_config(prefill=pre, decode=dec, tenants=tenants, health_interval_s=0.5, **kw))


def _post(url: str, key: str | None, body: dict[str, Any] = BODY, **headers: str) -> httpx.Response:
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(url + "/generate", json=body, headers=headers, timeout=30)


def _usage(r: httpx.Response) -> tuple[int, int, int]:
    m = r.json()["meta_info"]
    return m["prompt_tokens"], m["cached_tokens"], m["completion_tokens"]


def _metric(text: str, name: str, **labels: str) -> float:
    """One sample of the Prometheus text, found by name and label set (in whatever order it lists them)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"{name}{labels} not in /metrics")


def test_two_tenants_at_their_limits_one_is_refused_the_other_unaffected(cluster: ThreadedSimCluster) -> None:
    tenants = [TenantSpec("team-a", key_digest(KEY_A), requests_per_s=1.0, burst=3),
               TenantSpec("team-b", key_digest(KEY_B), requests_per_s=200.0, burst=200)]
    router = _router(cluster, tenants)
    try:
        got: dict[str, list[httpx.Response]] = {"a": [], "b": []}
        # bounded load: 10 rounds of requests at once (team-a: 1/s with a burst of 3)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for _ in range(10):  # team-a sends twice per round, at least twice its rate
                fa = [pool.submit(_post, router.url, KEY_A) for _ in range(2)]
                fb = pool.submit(_post, router.url, KEY_B)
                got["a"] += [f.result() for f in fa]
                got["b"].append(fb.result())
        assert [r.status_code for r in got["b"]] == [200] * 10  # unaffected by team-a's refusals
        ok_a = [r for r in got["a"] if r.status_code == 200]
        refused = [r for r in got["a"] if r.status_code == 429]
        elapsed = time.monotonic() - t0
        assert 3 <= len(ok_a) <= 3 + elapsed + 1 and refused and len(ok_a) + len(refused) == 20
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            err = r.json()["error"]
            assert err["limit"] == "requests_per_s" and err["code"] == 429 and err["type"] == "rate_limit_error"
            assert "team-b" not in r.text
        time.sleep(int(refused[-1].headers["retry-after"]))
        again = _post(router.url, KEY_A)
        assert again.status_code == 200  # after Retry-After the tenant is served again
        ok_a.append(again)

        # per-tenant token counts = the sum of the workers' usage fields of that tenant's answers
        metrics = httpx.get(router.url + "/metrics").text
        for name, answers in (("team-a", ok_a), ("team-b", got["b"])):
            sums = [sum(col) for col in zip(*(_usage(r) for r in answers), strict=True)]
            assert _metric(metrics, "inferctl_tenant_input_tokens_total", tenant=name) == sums[0]
            assert _metric(metrics, "inferctl_tenant_cached_tokens_total", tenant=name) == sums[1]
            assert _metric(metrics, "inferctl_tenant_output_tokens_total", tenant=name) == sums[2]
            assert _metric(metrics, "inferctl_tenant_requests_total", tenant=name) == len(answers)
        assert _metric(metrics, "inferctl_tenant_rejected_total", tenant="team-a", limit="requests_per_s") == len(refused)
        assert _metric(metrics, "inferctl_router_rejected_total", reason="tenant_requests_per_s") == len(refused)
        doc = httpx.get(router.url + "/admin/tenants").json()
        a = next(t for t in doc["tenants"] if t["tenant"] == "team-a")
        assert doc["mode"] == "key" and a["rejected"] == {"requests_per_s": len(refused)}
        assert a["output_tokens"] == sum(_usage(r)[2] for r in ok_a)
    finally:
        router.stop()


def test_unknown_keys_get_401_naming_no_tenant_compared_in_constant_time(cluster: ThreadedSimCluster) -> None:
    router = _router(cluster, [TenantSpec("team-a", key_digest(KEY_A)), TenantSpec("team-b", key_digest(KEY_B))])
    try:
        answers = [_post(router.url, "wrong-key-0123456789abcdef0123"), _post(router.url, None),
                   _post(router.url, KEY_A[:-1]), httpx.post(router.url + "/generate", json=BODY, timeout=30,
                                                             headers={"authorization": f"Basic {KEY_A}"})]
        for r in answers:
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["limit"] == "auth"
            assert "team" not in r.text
        assert len({r.text for r in answers}) == 1  # the same answer whatever was wrong
        assert _post(router.url, KEY_B).status_code == 200
        assert _metric(httpx.get(router.url + "/metrics").text, "inferctl_tenant_rejected_total",
                       tenant="unknown", limit="auth") == 4
    finally:
        router.stop()


def test_tokens_per_minute_refuses_once_spent_and_names_the_limit(cluster: ThreadedSimCluster) -> None:
    router = _router(cluster, [TenantSpec("small", key_digest(KEY_A), tokens_per_min=60)])
    try:
        first = _post(router.url, KEY_A, {"text": "x " * 100, "sampling_params": {"max_new_tokens": 8}})
        assert first.status_code == 200 and sum(_usage(first)[::2]) > 60  # the bucket is in debt now
        second = _post(router.url, KEY_A)
        assert second.status_code == 429 and second.json()["error"]["limit"] == "tokens_per_min"
        assert int(second.headers["retry-after"]) >= (sum(_usage(first)[::2]) - 60)  # 1 token/s refill
    finally:
        router.stop()


def test_max_concurrency_refuses_the_request_over_it(cluster: ThreadedSimCluster) -> None:
    router = _router(cluster, [TenantSpec("one-at-a-time", key_digest(KEY_A), max_concurrency=1),
                               TenantSpec("other", key_digest(KEY_B), max_concurrency=1)])
    try:
        slow = {"text": "slow " * 8, "stream": True, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}
        with httpx.stream("POST", router.url + "/generate", json=slow, timeout=30,
                          headers={"authorization": f"Bearer {KEY_A}"}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: a dropped iterator closes the stream (and ends the request)
            next(lines)  # the first one is in flight
            over = _post(router.url, KEY_A)
            assert over.status_code == 429 and over.json()["error"]["limit"] == "max_concurrency"
            assert _post(router.url, KEY_B).status_code == 200  # another tenant's slot
        assert _post(router.url, KEY_A).status_code == 200
    finally:
        router.stop()


def test_header_mode_and_allowed_prefixes(cluster: ThreadedSimCluster) -> None:
    from infer_ctl.router.config import PrefixSpec

    prompt = "You are the billing assistant of Example Corp. Answer in one line. " * 3
    router = _router(cluster, [TenantSpec("billing", prefixes=frozenset({"billing-v1"})),
                               TenantSpec("guest", prefixes=frozenset())],
                     prefixes=[PrefixSpec("billing-v1", prompt)])
    try:
        body = {"text": prompt + "Why was I charged twice?", "sampling_params": {"max_new_tokens": 2}}
        assert _post(router.url, None, body, **{"x-inferctl-tenant": "guest"}).status_code == 200
        assert _post(router.url, None, body, **{"x-inferctl-tenant": "nobody"}).status_code == 401
        prefix = httpx.get(router.url + "/admin/prefixes").json()["prefixes"][0]
        assert prefix["stats"]["requests"] == 0  # guest may not use billing's warm replicas
        assert _post(router.url, None, body, **{"x-inferctl-tenant": "billing"}).status_code == 200
        prefix = httpx.get(router.url + "/admin/prefixes").json()["prefixes"][0]
        assert prefix["stats"]["requests"] == 1
    finally:
        router.stop()


def test_cost_per_tenant_plus_idle_is_the_workers_whole_lease(cluster: ThreadedSimCluster) -> None:
    prices = {"prefill": 20.0 / 3600, "decode": 28.0 / 3600}  # $/s per worker
    router = _router(cluster, [TenantSpec("team-a", key_digest(KEY_A)), TenantSpec("team-b", key_digest(KEY_B))],
                     worker_usd_per_s=prices)
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            futs = [pool.submit(_post, router.url, key, {"text": f"cost {i} " * 20, "sampling_params":
                                                         {"max_new_tokens": 16 if key == KEY_A else 4}})
                    for i, key in enumerate([KEY_A, KEY_B] * 6)]
            assert all(f.result().status_code == 200 for f in futs)

        async def ledger() -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, float]]:
            t = router.router.observing.tenancy
            idle = t.idle_usd()  # advances every clock to now
            roles = {w.url: w.role for w in router.router.workers.all()}
            lease: dict[str, float] = {}
            for url, c in t.clocks.items():
                lease[roles[url]] = lease.get(roles[url], 0.0) + (c.last - c.started) * prices[roles[url]]
            return {n: dict(s.cost) for n, s in t.tenants.items()}, idle, lease

        costs, idle, lease = router.call(ledger())
        for role in ("prefill", "decode"):
            attributed = sum(c.get(role, 0.0) for c in costs.values())
            assert attributed > 0
            assert attributed + idle.get(role, 0.0) == pytest.approx(lease[role], rel=1e-9)
        # alone on the workers a request's share is its whole call: one long answer costs more decode time
        # than one short one (same prompt length, so the same prefill)
        before = {n: c["decode"] for n, c in costs.items()}
        for key, tokens in ((KEY_A, 96), (KEY_B, 1)):
            assert _post(router.url, key, {"text": "alone " * 20, "sampling_params": {"max_new_tokens": tokens,
                                                                                      "ignore_eos": True}}).status_code == 200
        after = {n: c["decode"] for n, c in router.call(ledger())[0].items()}
        assert after["team-a"] - before["team-a"] > after["team-b"] - before["team-b"] > 0
        metrics = httpx.get(router.url + "/metrics").text
        assert _metric(metrics, "inferctl_tenant_cost_dollars_total", tenant="team-a", role="decode") > 0
        assert _metric(metrics, "inferctl_router_idle_cost_dollars_total", role="prefill") >= 0
    finally:
        router.stop()


def test_the_tenants_priority_reaches_both_workers_replacing_the_clients(recording: Any) -> None:  # noqa: F811
    pre, dec, seen = recording
    router = start_router_in_thread(router_config(prefill=[(pre, 8998)], decode=[dec],
                                                  tenants=[TenantSpec("gold", key_digest(KEY_A), priority=10)]))
    try:
        r = _post(router.url, KEY_A, {"text": "hi", "priority": 1_000_000, "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 200, r.text
    finally:
        router.stop()
    assert sorted((c["role"], c["body"]["priority"]) for c in seen) == [("decode", 10), ("prefill", 10)]
    assert "authorization" not in {k.lower() for c in seen for k in c["headers"]}  # the key stays at the router


def test_no_tenants_no_pricing_no_tracing_means_no_observer(cluster: ThreadedSimCluster) -> None:
    router = _router(cluster, [])
    try:
        assert router.router.observing is None
        assert _post(router.url, None).status_code == 200
        assert "inferctl_tenant_requests_total" not in httpx.get(router.url + "/metrics").text
        assert httpx.get(router.url + "/admin/tenants").json() == {"mode": "off", "tenants": []}
    finally:
        router.stop()


# ---- the profile ---------------------------------------------------------------------------------
PROFILE = """
name: t
nodes:
  - {name: p1, host: 127.0.0.1, connection: local, roles: [prefill], gpus: 8}
  - {name: p2, host: 127.0.0.2, connection: local, roles: [prefill], gpus: 8}
  - {name: d1, host: 127.0.0.3, connection: local, roles: [decode], gpus: 8}
models:
  target: {path: m, preset: llama-3.1-70b, tp: 8}
router:
  pricing:
    prefill: {gpu_hour_usd: 2.5}
    decode: {node_hour_usd: 28}
  tenants:
%s
"""


def _profile(tenants: str) -> Any:
    return parse_profile_text(PROFILE % tenants)


def test_profile_keys_are_hashed_or_read_from_env_or_file_never_kept(tmp_path: Path) -> None:
    key_file = tmp_path / "c.key"
    key_file.write_text(KEY_B + "\n")
    sha = hashlib.sha256(KEY_A.encode()).hexdigest()
    prof = _profile(f"""    - {{name: a, key_sha256: {sha}, requests_per_s: 5, priority: 3}}
    - {{name: b, key_env: TEAM_B_KEY, tokens_per_min: 1000}}
    - {{name: c, key_file: {key_file}, max_concurrency: 2, prefixes: [x]}}""")
    cfg = from_profile(prof, env={"TEAM_B_KEY": KEY_B})
    assert [(t.name, t.digest) for t in cfg.tenants] == [("a", key_digest(KEY_A)), ("b", key_digest(KEY_B)),
                                                          ("c", key_digest(KEY_B))]
    assert KEY_B not in json.dumps([str(t) for t in cfg.tenants])
    assert cfg.tenants[0].priority == 3 and cfg.tenants[2].prefixes == frozenset({"x"})
    assert cfg.worker_usd_per_s == {"prefill": pytest.approx(20.0 / 3600), "decode": pytest.approx(28.0 / 3600)}
    with pytest.raises(UsageError, match="TEAM_B_KEY"):
        from_profile(prof, env={})
    with pytest.raises(UsageError, match="fewer than"):
        from_profile(prof, env={"TEAM_B_KEY": "short"})


@pytest.mark.parametrize(("tenants", "message"), [
    ("    - {name: a, key_env: A}\n    - {name: b}", "has no key while others do"),
    ("    - {name: a}\n    - {name: a}", "duplicate tenant name"),
    ("    - {name: a, key_env: A, key_file: f}", "at most one of"),
    ("    - {name: a, burst: 3}", "give requests_per_s too"),
])
def test_profile_tenant_rules(tenants: str, message: str) -> None:
    from infer_ctl.errors import InferctlError

    with pytest.raises(InferctlError, match=message):
        _profile(tenants)


def test_router_tenants_view_and_tenant_key(cluster: ThreadedSimCluster, capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.cli.main import main

    assert main(["router", "tenant-key", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert hashlib.sha256(made["key"].encode()).hexdigest() == made["key_sha256"] and len(made["key"]) >= 40
    router = _router(cluster, [TenantSpec("team-a", bytes.fromhex(made["key_sha256"]), requests_per_s=1.0, burst=1)],
                     worker_usd_per_s={"prefill": 0.01, "decode": 0.01})
    try:
        assert _post(router.url, made["key"]).status_code == 200
        assert _post(router.url, made["key"]).status_code == 429
        code = main(["router", "tenants", "--url", router.url, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == 1  # a tenant was refused by a limit
        (t,) = doc["tenants"]
        assert (t["tenant"], t["requests"], t["rejected"]) == ("team-a", 1, {"requests_per_s": 1})
        assert t["input_tokens"] > 0 and sum(t["cost_usd"].values()) > 0
        assert main(["router", "tenants", "--url", router.url]) == 1
        text = capsys.readouterr().out
        assert "team-a" in text and "requests_per_s" in text
    finally:
        router.stop()
