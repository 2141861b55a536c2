"""Several `router serve` replicas, one fleet: real router processes over simulated workers that publish
KV events, sharing named prefixes and worker changes through a real redis-server.

- the same prompt gets the same prefill on both replicas (each builds the same exact index from the
  workers' KV events; neither has seen the other's traffic);
- an admin change on one replica (prefix add, new version, expire, warm, remove; worker drain) is in
  force on the other within 1 s (measured), and a named prefix is placed on the same workers by both;
- a change written to the store whose message was lost is picked up by the periodic resync;
- the store killed (SIGKILL): both keep serving, admin changes get a 503 that says why, the status and a
  gauge show it; the store back (empty: no persistence): both reconnect, re-seed it, changes flow again;
- replica A killed with SIGKILL while B has requests in flight: none of B's fails; A restarted loads the
  fleet's state from the store.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE
from tests.router.redis_server import RedisServer, need_redis
from tests.sim.kv_client import free_port, kv_config
from tests.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
WORDS = ["account", "billing", "cluster", "deploy", "engine", "fabric", "gateway", "health", "inference", "kernel"]


def prompt(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Replica:
    """One `inferctl router serve -p profile --listen ADDR` process; its JSON log goes to a file."""

    def __init__(self, profile: Path, addr: str, args: list[str], log: Path) -> None:
        self.profile, self.addr, self.args, self.log = profile, addr, args, log
        self.url = f"http://{addr}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Replica:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infer_ctl", "router", "serve", "-p", str(self.profile), "--listen", self.addr,
                 "--log-requests", *self.args], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        assert wait_for(self._ready, timeout=60, every=0.1), self.log.read_text()[-3000:]
        return self

    def _ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200 and self.status()["state_store"]["connected"]
        except httpx.HTTPError:
            return False

    def status(self) -> dict[str, Any]:
        return httpx.get(self.url + "/admin/status", timeout=5).json()

    def prefixes(self) -> dict[str, dict[str, Any]]:
        doc = httpx.get(self.url + "/admin/prefixes", timeout=5).json()
        return {f"{p['name']}@{p['version']}": p for p in doc["prefixes"]}

    def workers(self) -> dict[str, dict[str, Any]]:
        return {w["url"]: w for w in httpx.get(self.url + "/admin/workers", timeout=5).json()["workers"]}

    def decisions(self) -> dict[str, str]:
        """request id -> the prefill this replica chose (its --log-requests lines)."""
        out = {}
        for line in self.log.read_text().splitlines():
            if line.startswith("{") and '"request done"' in line:
                doc = json.loads(line)
                out[doc["rid"]] = doc["prefill"]
        return out

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    need_redis()
    kw: dict[str, Any] = {"time_scale": TIME_SCALE, "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    specs = [WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
             WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
             WorkerSpec("decode", **kw)]
    c = start_cluster_in_thread(specs)
    yield c
    c.stop()


class Fleet:
    def __init__(self, redis: RedisServer, a: Replica, b: Replica, bootstrap: dict[str, int | None]) -> None:
        self.redis, self.a, self.b, self.bootstrap = redis, a, b, bootstrap
        self.prefills = list(bootstrap)


@pytest.fixture(scope="module")
def fleet(cluster: ThreadedSimCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("replicas")
    redis = RedisServer().start()
    addrs = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    profile = tmp / "fleet.yaml"
    profile.write_text(f"""
name: fleet-test
nodes:
  - {{name: p, host: 127.0.0.11, connection: local, roles: [prefill], gpus: 1}}
  - {{name: d, host: 127.0.0.21, connection: local, roles: [decode], gpus: 1}}
router:
  health_interval_s: 0.3
  replicas: [{addrs[0]}, {addrs[1]}]
  state_store: {redis.url}
  prefixes:
    - {{name: from-profile, text: "You are the profile's assistant. ", replicas: 1}}
""")
    pre = [w for w in cluster.workers if w.spec.role == "prefill"]
    args = [a for w in pre for a in ("--prefill", f"{w.url}@{w.bootstrap_port}")]
    args += [a for w in cluster.workers if w.spec.role == "decode" for a in ("--decode", w.url)]
    a = Replica(profile, addrs[0], args, tmp / "a.log")
    b = Replica(profile, addrs[1], args, tmp / "b.log")
    try:
        a.start()
        b.start()
        yield Fleet(redis, a, b, {w.url: w.bootstrap_port for w in pre})
    finally:
        for r in (a, b):
            r.stop()
        redis.stop()


def generate(url: str, text: str, rid: str, max_new_tokens: int = 2, client: httpx.Client | None = None) -> httpx.Response:
    c = client or httpx
    return c.post(url + "/generate", headers={"x-request-id": rid}, timeout=60,
                  json={"text": text, "sampling_params": {"max_new_tokens": max_new_tokens}})


def same_blocks(a: Replica, b: Replica, urls: list[str]) -> bool:
    """Both replicas' exact indexes hold the same number of blocks per worker, all of them some."""
    wa, wb = a.workers(), b.workers()
    return all(wa[u]["kv_blocks"] == wb[u]["kv_blocks"] > 0 for u in urls)


def exact(r: Replica, urls: list[str]) -> bool:
    w = r.workers()
    return all(w[u].get("index") == "exact" for u in urls)


def cached_tokens(r: Replica) -> dict[str, int]:
    """request id -> the cached tokens the worker reported (the replica's --log-requests lines)."""
    out = {}
    for line in r.log.read_text().splitlines():
        if line.startswith("{") and '"request done"' in line:
            doc = json.loads(line)
            out[doc["rid"]] = doc["cached_tokens"]
    return out


def test_both_replicas_route_the_same_prompt_to_the_same_prefill(fleet: Fleet) -> None:
    """Each replica builds the same exact index from the workers' KV events. Prompts sent to A only are
    placed by A's fallback over both prefills; follow-ups through B, which never saw them, go where A put
    them (B anchors a prompt it never saw before routing it: kv_routing.lookup), as do A's."""
    a, b = fleet.a, fleet.b
    assert wait_for(lambda: exact(a, fleet.prefills) and exact(b, fleet.prefills))
    rng = random.Random(5)
    seeds = [prompt(rng, 300) for _ in range(8)]
    for i, s in enumerate(seeds):
        assert generate(a.url, s, f"seed-{i}").status_code == 200
    assert wait_for(lambda: same_blocks(a, b, fleet.prefills))  # the workers' KV events reached both
    for i, s in enumerate(seeds):
        tail = " Q: " + prompt(rng, 8)
        assert generate(b.url, s + tail, f"b-{i}").status_code == 200
        assert generate(a.url, s + tail, f"a-{i}").status_code == 200
    da, db = a.decisions(), b.decisions()
    seeded = [da[f"seed-{i}"] for i in range(8)]
    assert len(set(seeded)) == 2, seeded  # the fallback spread the seeds: both prefills hold some
    assert [db[f"b-{i}"] for i in range(8)] == seeded
    assert [da[f"a-{i}"] for i in range(8)] == seeded
    ca, cb = cached_tokens(a), cached_tokens(b)
    assert all(cb[f"b-{i}"] >= 0.9 * ca[f"a-{i}"] > 0 for i in range(8)), (ca, cb)
    first = b.status()["kv_events"]["first_sight"]
    assert first["anchored"] >= 8 and first["over_budget"] == 0, first
    print("B's first-sight anchoring:", first)


class Clock:
    """When an admin request was sent: monotonic (for what a client sees) and wall (the replicas' logs)."""

    def __init__(self) -> None:
        self.mono, self.wall = time.monotonic(), time.time()


def applied_at(r: Replica, kind: str, key: str, after: float) -> float | None:
    """When replica r applied a shared change of kind:key (its log), the first time after `after`."""
    for line in r.log.read_text().splitlines():
        if line.startswith("{") and '"shared change applied"' in line:
            doc = json.loads(line)
            if doc["kind"] == kind and doc["key"] == key and doc["applied_at"] >= after:
                return float(doc["applied_at"])
    return None


def _in_force(check: Callable[[], bool], t0: Clock, other: Replica | None = None, kind: str = "", key: str = "",
              limit_s: float = 1.0) -> float:
    """Called when the replica that took the admin call has answered it (the change is made): seconds until
    the change was in force on the other replica (applied there: its log), asserted under `limit_s`; 0 when
    it was in force there before the answer came (the store publishes before it answers the writer).
    Also: `check` (what a client of the other replica sees) holds, and the time from sending the admin
    request (which includes that call, on a machine shared with other suites) is kept for the report."""
    answered = time.time()
    assert wait_for(check, timeout=limit_s + 5, every=0.01), "never in force on the other replica"
    seen = time.monotonic() - t0.mono
    if other is None:
        assert seen < limit_s, f"in force after {seen:.3f} s"
        return seen
    at = wait_for(lambda: applied_at(other, kind, key, t0.wall), timeout=2)
    assert at is not None, "the other replica did not log the change"
    took = max(0.0, at - answered)
    assert took < limit_s, f"in force on the other replica {took:.3f} s after the change was made"
    assert at - t0.wall < 2 * limit_s, f"in force on the other replica {at - t0.wall:.3f} s after the admin request"
    TOOK.append((kind, round(answered - t0.wall, 3), round(at - t0.wall, 3)))
    return took


#: (kind, s from sending the admin request to its answer, s from sending it to in force on the other replica)
TOOK: list[tuple[str, float, float]] = []


def expiry(r: Replica, key: str) -> tuple[float, float]:
    """(wall time at which the prefix version expires on replica r, the uncertainty of that reading)."""
    t1 = time.time()
    left = r.prefixes()[key]["expires_in_s"]
    t2 = time.time()
    return (t1 + t2) / 2 + left, (t2 - t1) / 2 + 0.05  # expires_in_s is rounded to 0.1 s


def same_expiry(a: Replica, b: Replica, key: str) -> bool:
    (ea, da), (eb, db) = expiry(a, key), expiry(b, key)
    return abs(ea - eb) <= da + db + 0.02


def test_admin_changes_on_one_replica_are_in_force_on_the_other_within_1s(fleet: Fleet) -> None:
    a, b = fleet.a, fleet.b
    took: dict[str, float] = {}
    t0 = Clock()
    r = httpx.post(a.url + "/admin/prefixes", json={"name": "sys", "text": "You are a billing assistant. " * 20,
                                                     "replicas": 1, "ttl_s": 3600})
    assert r.status_code == 201, r.text
    took["add"] = _in_force(lambda: b.prefixes().get("sys@1", {}).get("state") == "active", t0, b, "prefix", "sys")
    pa, pb = a.prefixes()["sys@1"], b.prefixes()["sys@1"]
    assert (pa["digest"], pa["ttl_s"], pa["replicas_wanted"]) == (pb["digest"], pb["ttl_s"], pb["replicas_wanted"])
    assert same_expiry(a, b, "sys@1")  # the same absolute expiry
    # both place it on the same prefill (rendezvous hash over the same available workers) and warm it
    assert wait_for(lambda: all(p["warm"] for r_ in (a, b) for p in r_.prefixes()["sys@1"]["replicas"])
                    and a.prefixes()["sys@1"]["replicas"])
    assert [p["worker"] for p in a.prefixes()["sys@1"]["replicas"]] == \
        [p["worker"] for p in b.prefixes()["sys@1"]["replicas"]]

    # a new version from B keeps the settings and supersedes v1 on A
    t0 = Clock()
    r = httpx.post(b.url + "/admin/prefixes", json={"name": "sys", "text": "You are a billing assistant, v2. " * 20})
    assert r.status_code == 201 and r.json()["prefix"]["version"] == 2
    took["new version"] = _in_force(lambda: (p := a.prefixes()).get("sys@2", {}).get("state") == "active"
                                    and p["sys@1"]["state"] == "superseded", t0, a, "prefix", "sys")
    assert a.prefixes()["sys@2"]["ttl_s"] == 3600

    t0 = Clock()
    r = httpx.post(a.url + "/admin/prefixes/sys/warm")
    assert r.status_code == 200
    took["warm"] = _in_force(lambda: same_expiry(a, b, "sys@2") and expiry(b, "sys@2")[0] > t0.wall + 3599.8,
                             t0, b, "prefix", "sys")

    t0 = Clock()
    r = httpx.post(b.url + "/admin/prefixes/sys/expire")
    assert r.status_code == 200
    took["expire"] = _in_force(lambda: a.prefixes()["sys@2"]["state"] == "expired", t0, a, "prefix", "sys")

    t0 = Clock()
    r = httpx.post(a.url + "/admin/prefixes/sys/remove")
    assert r.status_code == 200 and r.json()["versions"] == [1, 2]
    took["remove"] = _in_force(lambda: not any(k.startswith("sys@") for k in b.prefixes()), t0, b, "prefix", "sys")
    assert httpx.post(b.url + "/admin/prefixes/sys/remove").status_code == 404  # gone fleet-wide

    # a TTL runs out at the same moment on both, computed from the stored absolute time
    assert httpx.post(a.url + "/admin/prefixes", json={"name": "short", "text": "Short-lived. " * 10,
                                                        "ttl_s": 3.0}).status_code == 201
    assert wait_for(lambda: b.prefixes().get("short@1", {}).get("state") == "active", timeout=2)
    ends, _ = expiry(a, "short@1")
    seen: dict[str, float] = {}

    def expired() -> bool:
        for name, r_ in (("a", a), ("b", b)):
            if name not in seen and r_.prefixes()["short@1"]["state"] == "expired":
                seen[name] = time.time()
        return len(seen) == 2

    assert wait_for(expired, timeout=8)
    # neither early; each within its warmer's tick (0.5 s) plus a poll at this load
    assert all(ends - 0.15 <= t <= ends + 1.5 for t in seen.values()), (ends, seen)

    # a worker drained on A is drained on B (no new requests from either), and undrained likewise
    victim = fleet.prefills[0]
    t0 = Clock()
    r = httpx.post(a.url + "/admin/workers/drain", json={"url": victim, "timeout_s": 0})
    assert r.status_code == 200, r.text
    took["drain"] = _in_force(lambda: b.workers()[victim]["draining"] is True, t0, b, "worker", victim)
    t0 = Clock()
    r = httpx.post(b.url + "/admin/workers/drain", json={"url": victim, "drain": False})
    assert r.status_code == 200
    took["undrain"] = _in_force(lambda: a.workers()[victim]["draining"] is False, t0, a, "worker", victim)
    # removed on A: gone from B; added back on B: back on A (and exact again on both)
    t0 = Clock()
    assert httpx.post(a.url + "/admin/workers/remove", json={"url": victim}).status_code == 200
    took["remove worker"] = _in_force(lambda: victim not in b.workers(), t0, b, "worker", victim)
    t0 = Clock()
    r = httpx.post(b.url + "/admin/workers", json={"url": victim, "role": "prefill",
                                                    "bootstrap_port": fleet.bootstrap[victim]})
    assert r.status_code == 201, r.text
    took["add worker"] = _in_force(lambda: victim in a.workers(), t0, a, "worker", victim)
    assert wait_for(lambda: exact(a, fleet.prefills) and exact(b, fleet.prefills))
    # the profile's prefix was seeded once and is the same record on both
    assert a.prefixes()["from-profile@1"]["digest"] == b.prefixes()["from-profile@1"]["digest"]
    print("in force on the other replica after the change was made (s):", {k: round(v, 3) for k, v in took.items()})
    print("(kind, answered after, in force on the other replica after) from sending the admin request:", TOOK)


def test_concurrent_changes_of_one_name_on_both_replicas_lose_none(fleet: Fleet) -> None:
    """Each change is computed on the stored record and written only if nobody wrote in between (compare
    and set): 12 new versions sent to A and B at once give 12 versions, the same on both."""
    a, b = fleet.a, fleet.b
    results: list[int] = []

    def add(k: int) -> None:
        url = (a if k % 2 else b).url
        r = httpx.post(url + "/admin/prefixes", json={"name": "race", "text": f"Version text {k}. " * 5}, timeout=30)
        results.append(r.status_code)

    threads = [threading.Thread(target=add, args=(k,)) for k in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [201] * 12

    def versions(r: Replica) -> list[tuple[int, str, str]]:
        return sorted((p["version"], p["digest"], p["state"]) for k, p in r.prefixes().items() if k.startswith("race@"))

    assert wait_for(lambda: len(versions(a)) == 12 and versions(a) == versions(b), timeout=2), (versions(a), versions(b))
    assert [v for v, _, _ in versions(a)] == list(range(1, 13))
    assert [s for _, _, s in versions(a)].count("active") == 1
    assert httpx.post(a.url + "/admin/prefixes/race/remove").status_code == 200


def test_a_lost_message_is_healed_by_the_periodic_resync(fleet: Fleet) -> None:
    """A change in the store that was never published (as if both replicas missed the message)."""
    a, b = fleet.a, fleet.b
    assert httpx.post(a.url + "/admin/prefixes", json={"name": "quiet", "text": "Quiet one. " * 10}).status_code == 201
    assert wait_for(lambda: "quiet@1" in b.prefixes(), timeout=1)
    store = fleet.redis.client()
    key = "inferctl:router:{fleet-test}:state"
    value = json.loads(store.hget(key, "prefix:quiet"))
    value["record"]["versions"][0]["replicas"] = 2
    value["rev"] = store.incr("inferctl:router:{fleet-test}:rev")
    store.hset(key, "prefix:quiet", json.dumps(value))  # no PUBLISH
    took = time.monotonic()
    assert wait_for(lambda: a.prefixes()["quiet@1"]["replicas_wanted"] == 2
                    and b.prefixes()["quiet@1"]["replicas_wanted"] == 2, timeout=8)
    assert time.monotonic() - took < 7.0  # resync_s is 5, plus polls on a loaded machine
    store.close()


def test_store_down_keeps_serving_refuses_changes_then_resyncs(fleet: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = fleet.a, fleet.b
    assert httpx.post(a.url + "/admin/prefixes", json={"name": "kept", "text": "Kept across outages. " * 10}).status_code == 201
    assert wait_for(lambda: "kept@1" in b.prefixes(), timeout=1)
    fleet.redis.kill()
    try:
        assert wait_for(lambda: not a.status()["state_store"]["connected"] and not b.status()["state_store"]["connected"],
                        timeout=8)
        st = a.status()["state_store"]
        assert st["error"] and st["url"] == fleet.redis.url
        assert "inferctl_router_state_store_up 0.0" in httpx.get(a.url + "/metrics").text
        capsys.readouterr()
        main(["router", "status", "--url", a.url])
        assert f"state store {fleet.redis.url}: UNREACHABLE" in capsys.readouterr().out
        for i in range(4):  # serving goes on, with the state held
            assert generate(a.url, "hello during the outage " + str(i), f"out-a-{i}").status_code == 200
            assert generate(b.url, "hello during the outage " + str(i), f"out-b-{i}").status_code == 200
        assert "kept@1" in a.prefixes() and "kept@1" in b.prefixes()
        r = httpx.post(b.url + "/admin/prefixes", json={"name": "refused", "text": "Not now. "})
        assert r.status_code == 503
        err = r.json()["error"]
        assert "unreachable" in err["message"] and "not made on any replica" in err["message"], err
        assert httpx.post(a.url + "/admin/workers/drain", json={"url": fleet.prefills[0], "timeout_s": 0}).status_code == 503
        assert not a.workers()[fleet.prefills[0]]["draining"]
        assert "refused@1" not in a.prefixes() and "refused@1" not in b.prefixes()
    finally:
        fleet.redis.start()  # the same port, empty (no persistence)
    assert wait_for(lambda: a.status()["state_store"]["connected"] and b.status()["state_store"]["connected"],
                    timeout=10)
    # re-seeded from what the replicas held, and changes flow again
    store = fleet.redis.client()
    assert wait_for(lambda: store.hexists("inferctl:router:{fleet-test}:state", "prefix:kept"), timeout=5)
    store.close()
    assert "inferctl_router_state_store_up 1.0" in httpx.get(a.url + "/metrics").text
    t0 = Clock()
    assert httpx.post(b.url + "/admin/prefixes", json={"name": "after", "text": "After the outage. "}).status_code == 201
    _in_force(lambda: "after@1" in a.prefixes(), t0, a, "prefix", "after")
    assert a.prefixes()["kept@1"]["digest"] == b.prefixes()["kept@1"]["digest"]


def test_sigkill_of_one_replica_loses_nothing_in_flight_on_the_other(fleet: Fleet) -> None:
    a, b = fleet.a, fleet.b
    rng = random.Random(9)
    tenants = [prompt(rng, 200) for _ in range(4)]
    spans: list[tuple[float, float, int]] = []
    errors: list[str] = []
    stop = threading.Event()

    def client(k: int, url: str, record: bool) -> None:
        r2 = random.Random(k)
        with httpx.Client(timeout=60) as c:
            n = 0
            while not stop.is_set():
                n += 1
                t0 = time.monotonic()
                try:
                    stream = n % 3 == 0
                    body = {"text": r2.choice(tenants) + " " + prompt(r2, 5),
                            "sampling_params": {"max_new_tokens": 24}, "stream": stream}
                    r = c.post(url + "/generate", json=body)
                    if stream:
                        assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text, r.text[-300:]
                    if record:
                        spans.append((t0, time.monotonic(), r.status_code))
                except (httpx.HTTPError, AssertionError) as exc:
                    if record:
                        errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(k, b.url, True)) for k in range(4)]
    threads += [threading.Thread(target=client, args=(10 + k, a.url, False)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: len(spans) > 10 and b.status()["active_requests"] > 0, timeout=30)
        a.kill()
        killed = time.monotonic()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(60)
        assert errors == []
        assert spans and {s for _, _, s in spans} == {200}, {s: [x[2] for x in spans].count(s) for _, _, s in spans}
        across = [s for s in spans if s[0] < killed < s[1]]
        assert across, "no request of B was in flight when A was killed"
        assert any(t0 > killed for t0, _, _ in spans)  # and B kept taking new ones
        assert b.status()["state_store"]["connected"]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        a.proc = None
    # A comes back and loads the fleet's state (a prefix added at runtime, not in its profile) from the store
    assert httpx.post(b.url + "/admin/prefixes", json={"name": "while-a-was-down", "text": "Added on B. " * 5}).status_code == 201
    a.start()
    assert "while-a-was-down@1" in a.prefixes()
    assert a.prefixes()["while-a-was-down@1"]["digest"] == b.prefixes()["while-a-was-down@1"]["digest"]
