"""The replicas' shared state (router/scaleout/state_sync.py) against a hostile or misbehaving store: two
in-process replicas (real Router objects, their StateSync) over a real redis-server, and the store
written behind their backs (records in another format, garbage, a huge rev, a restore from an older
snapshot, a worker change overtaken by a later one, clocks that disagree, a store that stops answering).
The router processes themselves: tests/router/scaleout/test_replicas.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from infer_ctl.cli.main import main as main_cli
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.router.config import RouterConfig, router_settings, worker
from infer_ctl.router.control import client as admin_client
from infer_ctl.router.daemon.assembly import build_router
from infer_ctl.router.scaleout.replica_records import ReplicaRecords
from infer_ctl.router.scaleout.state_sync import StateSync
from infer_ctl.router.scaleout.store_status import StoreUnavailable
from tests.router.redis_server import RedisServer, need_redis

NS = "t"
HASH, REV, EPOCH, CHANNEL = (f"inferctl:router:{{{NS}}}:{k}" for k in ("state", "rev", "epoch", "changes"))


class Replica:
    def __init__(self, url: str, *, wall: Callable[[], float] = time.time, timeout_s: float = 1.0,
                 resync_s: float = 5.0, namespace: str = NS, extra: tuple[str, ...] = (),
                 pool: tuple[str, str] = ("http://127.0.0.1:1", "http://127.0.0.1:2")) -> None:
        # built as the assembly builds a replica's router (its prefixes placed on shared terms)
        self.router = build_router(RouterConfig(workers=[worker(pool[0], "prefill", 8998), worker(pool[1], "decode"),
                                                         *(worker(u, "prefill", 8998) for u in extra)],
                                                settings=router_settings(state_store=url)))
        self.workers: dict[str, dict[str, Any]] = {}

        async def apply_worker(u: str, rec: dict[str, Any]) -> None:
            self.workers[u] = rec

        records = ReplicaRecords(self.router, apply_worker=apply_worker, on_prefix_change=lambda: None)
        self.sync = StateSync(self.router, records, url=url, password=None, namespace=namespace, timeout_s=timeout_s,
                              resync_s=resync_s, wall=wall)

    def texts(self, name: str) -> list[tuple[int, str, str]]:
        return [(r.version, r.text, r.state.value) for r in self.router.prefixes.records() if r.name == name]


def register(name: str, text: str, **kw: Any) -> Callable[[PrefixRegistry, float], Any]:
    return lambda reg, now: reg.register(name, text, now=now, **kw)


async def until(cond: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.01)
    return cond()


def subscribers(store: RedisServer) -> int:
    """Clients the store has subscribed to the changes channel (each replica's listening loop subscribes
    in the background after `StateSync.start` returns)."""
    c = store.client()
    try:
        return int(dict(c.pubsub_numsub(CHANNEL)).get(CHANNEL, 0))
    finally:
        c.close()


class Proxy:
    """A TCP relay in front of the store that can go silent on the subscribers' connections (stop relaying,
    keep the sockets open), as a firewall or NAT that drops a connection without a reset does."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conns: list[dict[str, bool]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.port)
        st = {"sub": False, "dead": False}
        self.conns.append(st)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, upstream: bool) -> None:
            try:
                while data := await src.read(65536):
                    if upstream and b"SUBSCRIBE" in data.upper():
                        st["sub"] = True
                    if not st["dead"]:
                        dst.write(data)
                        await dst.drain()
            except OSError:
                pass
            if not st["dead"]:
                dst.close()

        await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False))

    def silence_subscribers(self) -> int:
        n = 0
        for st in self.conns:
            if st["sub"] and not st["dead"]:
                st["dead"], n = True, n + 1
        return n

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def run_pair(body: Callable[[RedisServer, Replica, Replica], Awaitable[None]], *, proxy_a: bool = False,
             **kw: Any) -> None:
    need_redis()
    store = RedisServer().start()

    async def main() -> None:
        proxy = Proxy(store.port)
        url_a = await proxy.start() if proxy_a else store.url
        a, b = Replica(url_a, **kw), Replica(store.url, **kw)
        a.proxy = proxy  # type: ignore[attr-defined]
        await a.sync.start()
        await b.sync.start()
        try:
            await body(store, a, b)
        finally:
            async with asyncio.timeout(15):  # a stop that hangs is a router that does not exit on SIGTERM
                await a.sync.stop()
                await b.sync.stop()
            proxy.close()

    try:
        asyncio.run(main())
    finally:
        store.stop()


def record(rev: int, name: str, text: str | None = None) -> dict[str, Any]:
    versions = [] if text is None else [{"version": 1, "text": text, "registered_at": time.time(), "ttl_s": None,
                                         "replicas": 1, "pin": False, "fmt": "text", "state": "active",
                                         "ended_at": None, "warm_requests": 0}]
    return {"rev": rev, "kind": "prefix", "key": name, "record": {"name": name, "settings": None, "versions": versions}}


@pytest.mark.parametrize("raw", [
    # valid JSON, written by another tool (json.dumps puts a space after each colon)
    json.dumps(record(3, "p", "hand-written")),
    "not json{",
    '{"rev":"x","kind":"prefix"}',
])
def test_a_foreign_or_corrupt_stored_record_does_not_block_changes_of_that_name(raw: str) -> None:
    """Before: the CAS parsed the rev with a pattern (`^{"rev":N`), so a record in any other spelling never
    compared equal: 16 retries, then 503 'store unreachable' and the store marked down; garbage made the
    decode raise, same result. Now the CAS compares the stored value itself, and a record this replica
    cannot read is replaced by the change (logged)."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        c = store.client()
        c.hset(HASH, "prefix:p", raw)
        await a.sync.change_prefix("p", register("p", "the operator's text"))
        assert a.sync.up
        # the operator's text is the active version on both (after the foreign one where it was readable)
        assert await until(lambda: [t for _, t, s in b.texts("p") if s == "active"] == ["the operator's text"]), \
            b.texts("p")
        assert a.texts("p") == b.texts("p")
        c.close()

    run_pair(body)


def test_a_stored_rev_far_ahead_of_the_counter_does_not_silence_later_changes() -> None:
    """A record with rev 10**15 (written by hand, or left from another counter) is applied by both; before,
    the next change got a rev from INCR far below it, so every replica, the writer included, ignored it:
    201 and in force nowhere. Now a change's rev is above the stored record's."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        c = store.client()
        raw = json.dumps(record(10**15, "big", "old"), separators=(",", ":"))
        c.hset(HASH, "prefix:big", raw)
        c.publish(CHANNEL, raw)
        assert await until(lambda: a.texts("big") == b.texts("big") == [(1, "old", "active")])
        await b.sync.change_prefix("big", register("big", "new"))
        want = [(1, "old", "superseded"), (2, "new", "active")]
        assert b.texts("big") == want
        assert await until(lambda: a.texts("big") == want), a.texts("big")
        c.close()

    run_pair(body)


def test_a_store_restored_from_an_older_snapshot_neither_drops_later_changes_nor_rolls_back() -> None:
    """The store comes back from a snapshot taken before some changes (same epoch key, lower revs). Before:
    the next change of such a name got a rev below the one every replica held, so it was answered and
    applied nowhere; and the store kept the old record. Now a resync notices the store is behind what this
    replica holds, writes back what it holds, and later changes are in force on both."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        c = store.client()
        await a.sync.change_prefix("snap", register("snap", "v1"))
        snapshot = c.hgetall(HASH), c.get(REV)
        await a.sync.change_prefix("snap", register("snap", "v2"))
        await a.sync.change_prefix("other", register("other", "o1"))
        assert await until(lambda: len(b.texts("snap")) == 2 and b.texts("other"))
        c.delete(HASH)
        c.hset(HASH, mapping=snapshot[0])
        c.set(REV, snapshot[1])
        await a.sync._sync("resync")
        await b.sync._sync("resync")
        stored = json.loads(c.hget(HASH, "prefix:snap"))["record"]
        assert [v["text"] for v in stored["versions"]] == ["v1", "v2"]  # written back, not rolled back
        assert c.hexists(HASH, "prefix:other")
        await b.sync.change_prefix("snap", register("snap", "v3"))
        want = [(1, "v1", "superseded"), (2, "v2", "superseded"), (3, "v3", "active")]
        assert b.texts("snap") == want
        assert await until(lambda: a.texts("snap") == want), a.texts("snap")
        c.close()

    run_pair(body)


def test_a_worker_change_overtaken_by_a_later_one_is_not_applied_over_it() -> None:
    """A drains a worker; before A's write returns, B's later undrain has reached A (pub/sub and the
    reply come on different connections). Before: A then applied its own, older record over the later one
    and kept it (the rev it holds is the later one's, so no resync corrects it). Now it applies its own
    only if nothing later arrived."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        url = "http://127.0.0.1:1"
        real_write = a.sync._write

        async def write_then_overtaken(kind: str, key: str, rec: dict[str, Any], expected: Any) -> int:
            rev = await real_write(kind, key, rec, expected)
            later = {"rev": rev + 1, "kind": "worker", "key": url, "record": {"present": True, "draining": False}}
            a.sync._apply_raw(json.dumps(later), "message")  # B's undrain, delivered first
            await asyncio.sleep(0)
            return rev

        a.sync._write = write_then_overtaken  # type: ignore[method-assign]
        await a.sync.change_worker(url, {"present": True, "draining": True})
        await asyncio.sleep(0.05)
        assert a.workers[url]["draining"] is False

    run_pair(body)


def test_ttls_expire_at_the_same_moment_on_replicas_whose_clocks_disagree() -> None:
    """B's wall clock is 30 s ahead of A's (no NTP). Before: times were stored on the writer's wall clock
    and read on the reader's, so B saw a TTL 30 s shorter than A did. Now both read the store's clock
    (Redis TIME) for the absolute times."""
    need_redis()
    store = RedisServer().start()

    async def main() -> None:
        a, b = Replica(store.url), Replica(store.url, wall=lambda: time.time() + 30.0)
        await a.sync.start()
        await b.sync.start()
        try:
            await a.sync.change_prefix("ttl", register("ttl", "text", ttl_s=60.0))
            assert await until(lambda: bool(b.texts("ttl")))
            ea, eb = a.router.prefixes.active("ttl"), b.router.prefixes.active("ttl")
            assert ea is not None and eb is not None and ea.expires_at is not None and eb.expires_at is not None
            # both routers run on this host's monotonic clock: the same expiry, up to the offset measurement
            assert abs(ea.expires_at - eb.expires_at) < 0.05, (ea.expires_at, eb.expires_at)
        finally:
            await a.sync.stop()
            await b.sync.stop()

    try:
        asyncio.run(main())
    finally:
        store.stop()


def test_a_store_that_stops_answering_mid_change_gets_an_honest_503() -> None:
    """Redis frozen (SIGSTOP) while a change is on its way: the write may have reached it and be executed
    when it resumes. Before: the 503 said 'the change was not made on any replica', and then it was in
    force on both. Now the 503 says the outcome is unknown; a change refused before anything was sent
    still says it was not made."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        proc = store.proc
        assert proc is not None
        await a.sync.change_prefix("first", register("first", "x"))  # the script is in the store's cache
        real_write = a.sync._write

        async def freeze_then_write(kind: str, key: str, *args: Any, **kw: Any) -> int:
            if key == "frozen":  # the store stops between the change's read and its write
                proc.send_signal(signal.SIGSTOP)
            return await real_write(kind, key, *args, **kw)

        a.sync._write = freeze_then_write  # type: ignore[method-assign]
        try:
            with pytest.raises(StoreUnavailable) as exc:
                await a.sync.change_prefix("frozen", register("frozen", "made after all"))
        finally:
            proc.send_signal(signal.SIGCONT)
            a.sync._write = real_write  # type: ignore[method-assign]
        assert "not made on any replica" not in str(exc.value), str(exc.value)
        assert "may have been made" in str(exc.value), str(exc.value)
        with pytest.raises(StoreUnavailable, match="was not made on any replica"):  # refused up front: down
            await a.sync.change_prefix("refused", register("refused", "x"))
        assert await until(lambda: bool(b.texts("frozen")), timeout=8)  # it was made, after all

    run_pair(body, timeout_s=0.3)


def test_a_subscription_gone_silent_is_noticed_and_the_change_arrives_within_seconds() -> None:
    """A's subscription stops delivering while its socket stays open (the relay drops it silently). Before:
    A noticed nothing and missed every change until its next full resync (30 s here, 5 s by default). Now
    it pings on the subscription, takes 2 s of silence for dead, subscribes again and resyncs."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        proxy: Proxy = a.proxy  # type: ignore[attr-defined]
        # both replicas subscribed (their listening loops subscribe after start returns), A through the proxy
        assert await until(lambda: subscribers(store) == 2 and any(st["sub"] for st in proxy.conns), timeout=10)
        assert proxy.silence_subscribers() == 1
        t0 = time.monotonic()
        await b.sync.change_prefix("quiet", register("quiet", "said while A was deaf"))
        assert await until(lambda: bool(a.texts("quiet")), timeout=10), "A never heard of it"
        took = time.monotonic() - t0
        assert took < 3.5, took
        assert a.sync.up  # the store itself was fine all along: admin changes were never refused

    run_pair(body, proxy_a=True, resync_s=30.0)


def test_a_killed_subscription_reconnects_and_catches_up() -> None:
    """CLIENT KILL TYPE pubsub: the subscriber's socket is closed by the store; a change made right after
    is in force on A within about a second (reconnect, resync)."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        c = store.client()
        assert await until(lambda: subscribers(store) == 2, timeout=10)  # both listening loops subscribed
        assert c.client_kill_filter(_type="pubsub") >= 2
        t0 = time.monotonic()
        await b.sync.change_prefix("after-kill", register("after-kill", "text"))
        assert await until(lambda: bool(a.texts("after-kill")), timeout=5)
        assert time.monotonic() - t0 < 1.5
        c.close()

    run_pair(body, resync_s=30.0)


def test_a_flushed_store_is_reseeded_with_prefixes_and_worker_changes_and_takes_changes_again() -> None:
    """FLUSHALL behind the replicas' backs. The next change is refused (the store is not the one synced
    with) and makes a resync happen now, not at the next period: a retry a second later goes through. The
    store is re-seeded with the prefixes and, before, not with the worker changes (a drained worker came
    back undrained for a replica started after the flush)."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        url = "http://127.0.0.1:1"
        await a.sync.change_prefix("kept", register("kept", "text"))
        await a.sync.change_worker(url, {"present": True, "draining": True})
        assert await until(lambda: b.workers.get(url, {}).get("draining") is True)
        c = store.client()
        c.flushall()
        with pytest.raises(StoreUnavailable, match="not made on any replica"):
            await a.sync.change_prefix("new", register("new", "text"))
        assert await until(lambda: a.sync.up and b.sync.up and c.hexists(HASH, "prefix:kept"), timeout=1.5)
        await a.sync.change_prefix("new", register("new", "text"))
        assert await until(lambda: bool(b.texts("new")), timeout=1)
        assert await until(lambda: c.hexists(HASH, f"worker:{url}"), timeout=6), c.hkeys(HASH)
        assert json.loads(c.hget(HASH, f"worker:{url}"))["record"]["draining"] is True
        c.close()

    run_pair(body, resync_s=5.0)


def test_a_replica_started_with_a_worker_the_others_lack_adds_it_fleet_wide() -> None:
    """B's profile (or --prefill list) names a third prefill. Before: B routed over three prefills and A
    over two, for good, and nothing said so. Now each replica seeds the workers the store has no record
    of, so both route over the same three (the store's records win over what a replica started with)."""
    need_redis()
    store = RedisServer().start()

    async def main() -> None:
        a, b = Replica(store.url), Replica(store.url, extra=("http://127.0.0.1:3",))
        await a.sync.start()
        await b.sync.start()
        try:
            assert await until(lambda: a.workers.get("http://127.0.0.1:3", {}).get("present") is True)
            assert a.workers["http://127.0.0.1:3"]["role"] == "prefill"
            c = store.client()
            assert sorted(c.hkeys(HASH)) == [f"worker:http://127.0.0.1:{i}" for i in (1, 2, 3)]
            c.close()
        finally:
            await a.sync.stop()
            await b.sync.stop()

    try:
        asyncio.run(main())
    finally:
        store.stop()


def test_two_fleets_in_one_redis_database_do_not_see_each_others_changes() -> None:
    """Two profiles (names x and y) sharing one Redis db: every key carries the profile's name."""
    need_redis()
    store = RedisServer().start()

    async def main() -> None:
        x, y = Replica(store.url, namespace="x"), Replica(store.url, namespace="y", extra=("http://127.0.0.1:9",))
        await x.sync.start()
        await y.sync.start()
        try:
            await x.sync.change_prefix("sys", register("sys", "fleet x"))
            await y.sync.change_prefix("sys", register("sys", "fleet y"))
            await asyncio.sleep(0.3)
            assert x.texts("sys") == [(1, "fleet x", "active")] and y.texts("sys") == [(1, "fleet y", "active")]
            assert "http://127.0.0.1:9" not in x.workers
        finally:
            await x.sync.stop()
            await y.sync.stop()

    try:
        asyncio.run(main())
    finally:
        store.stop()


FLEET = f"inferctl:router:{{{NS}}}:fleet"
OTHER = ("http://127.0.0.2:1", "http://127.0.0.2:2")
T = TypeVar("T")


def with_store(main: Callable[[RedisServer], Coroutine[Any, Any, T]]) -> T:
    """`main` run against a redis-server of its own (the test skipped without one), stopped after it."""
    need_redis()
    store = RedisServer().start()
    try:
        return asyncio.run(main(store))
    finally:
        store.stop()


@contextlib.asynccontextmanager
async def started(*replicas: Replica) -> AsyncIterator[list[Replica]]:
    """The replicas' syncs started in turn; those still in the list stopped at the end (a test that stops
    one itself takes it out of the list)."""
    running = list(replicas)
    for r in running:
        await r.sync.start()
    try:
        yield running
    finally:
        for r in running:
            await r.sync.stop()


def put(store: RedisServer, key: str, value: str | bytes) -> None:
    """A value written behind the replicas' backs (expiring as the fleet marker does)."""
    c = store.client()
    try:
        c.set(key, value, ex=30)
    finally:
        c.close()


def test_a_fleet_whose_profile_has_another_fleet_s_name_stays_off_its_state() -> None:
    """Two fleets whose profiles are both named t, one Redis db, so one namespace: the second one to start
    (no worker in common with the first) takes none of the first's workers or prefixes and writes none of
    its own, says why, and refuses admin changes; a replica of the first fleet started with one more
    worker (a worker being added) shares the state as before."""

    async def main(store: RedisServer) -> None:
        a, a2 = Replica(store.url), Replica(store.url, extra=("http://127.0.0.1:7",))
        b = Replica(store.url, pool=OTHER, resync_s=0.5)
        async with started(a, b, a2) as running:
            assert a.sync.up and a2.sync.up and not b.sync.up
            assert b.sync.error is not None and "in use by another fleet" in b.sync.error, b.sync.error
            assert "http://127.0.0.1:1" in b.sync.error and "named 't'" in b.sync.error
            c = store.client()
            stored = c.hgetall(HASH)
            c.close()
            assert "worker:http://127.0.0.1:7" in stored and not any("127.0.0.2" in k for k in stored), stored
            await a.sync.change_prefix("sys", register("sys", "fleet a"))
            assert await until(lambda: a2.texts("sys") == [(1, "fleet a", "active")])
            await asyncio.sleep(0.3)
            assert b.texts("sys") == [] and "http://127.0.0.1:1" not in b.workers  # nothing of fleet a's
            with pytest.raises(StoreUnavailable, match=r"is not used .*another fleet"):
                await b.sync.change_prefix("sys", register("sys", "fleet b"))
            assert b.sync.status_doc()["connected"] is False
            # fleet a gone for good (the marker lapses 6 resyncs after its last replica's sync): b owns it
            c = store.client()
            assert 0 < c.ttl(FLEET) <= 30
            for r in (a, a2):
                running.remove(r)
                await r.sync.stop()
            c.delete(FLEET)
            c.close()
            assert await until(lambda: b.sync.up, timeout=5), b.sync.error

    with_store(main)


def test_two_fleets_starting_at_once_do_not_both_take_the_namespace() -> None:
    """Both fleets' replicas start together on an empty store (a store restarted empty, every replica of both
    reconnecting): one takes the namespace, the other stays off; the state holds one fleet's workers only
    (a GET then a SET let both read it free, both seed, and the fleet that stayed holds the other's workers)."""

    async def main(store: RedisServer) -> None:
        for _ in range(5):
            a, b = Replica(store.url), Replica(store.url, pool=OTHER)
            await asyncio.gather(a.sync.start(), b.sync.start())
            try:
                assert a.sync.up != b.sync.up, (a.sync.error, b.sync.error)
                c = store.client()
                stored = [k for k in c.hgetall(HASH) if k.startswith("worker:")]
                c.delete(HASH, REV, EPOCH, FLEET)
                c.close()
                assert len({k.rsplit(":", 2)[-2] for k in stored}) == 1, stored  # one fleet's hosts
            finally:
                await asyncio.gather(a.sync.stop(), b.sync.stop())

    with_store(main)


def test_a_replica_started_with_workers_added_at_runtime_shares_the_fleet_s_state() -> None:
    """Every worker of the fleet replaced at runtime (`inferctl router workers add/remove`), then a replica
    started with the new list: it is of the same fleet, though the running replica was started with the
    old list only."""

    async def main(store: RedisServer) -> None:
        a = Replica(store.url, resync_s=0.5)
        new = Replica(store.url, pool=("http://127.0.0.1:5", "http://127.0.0.1:6"))
        async with started(a) as running:
            for url in ("http://127.0.0.1:5", "http://127.0.0.1:6"):
                await a.sync.change_worker(url, {"present": True, "url": url, "role": "decode"})
            for url in ("http://127.0.0.1:1", "http://127.0.0.1:2"):
                await a.sync.change_worker(url, {"present": False, "url": url, "role": "decode"})
            await asyncio.sleep(0.7)  # a's listening loop resyncs, refreshing the fleet's workers
            running.append(new)
            await new.sync.start()
            assert new.sync.up, new.sync.error

    with_store(main)


def test_a_replica_kept_off_is_not_subscribed_to_the_other_fleet_s_changes_between_its_looks() -> None:
    """Between its looks (every resync_s) a replica of another fleet holds no subscription: the store would
    otherwise queue every change of the other fleet for a client that never reads it."""

    async def main(store: RedisServer) -> None:
        put(store, FLEET, json.dumps(["http://127.0.0.1:1"]))
        b = Replica(store.url, pool=OTHER, resync_s=3.0)
        async with started(b):
            await asyncio.sleep(1.0)
            assert not b.sync.up and subscribers(store) == 0

    with_store(main)


@pytest.mark.parametrize("marker", [b'["\xff\xfe"]', b'["' + b"h" * 1_000_000 + b'"]'],
                         ids=["not-utf-8", "a-1-MB-url"])
def test_a_fleet_marker_written_by_hand_keeps_the_replica_off_and_says_so_briefly(marker: bytes) -> None:
    """A list of strings Redis's JSON takes but Python's does not (not UTF-8), or one URL of 1 MB: the
    replica is kept off as for another fleet (not shown unreachable with a decode error), and the reason
    it logs and shows stays short."""

    async def main(store: RedisServer) -> None:
        put(store, FLEET, marker)
        b = Replica(store.url)
        async with started(b):
            assert not b.sync.up and b.sync.health.conflict, b.sync.error
            assert b.sync.error is not None and len(b.sync.error) < 1000, len(b.sync.error)

    with_store(main)


def test_a_fleet_conflict_is_logged_once_and_shown_as_such(caplog: Any, capsys: Any, monkeypatch: Any) -> None:
    """The other fleet's replicas, started with different lists, take turns writing the fleet's workers:
    the replica kept off logs the conflict once, not at every resync; `inferctl router status` shows the
    store not used because of another fleet, not unreachable."""

    async def main(store: RedisServer) -> dict[str, Any]:
        put(store, FLEET, json.dumps(["http://127.0.0.1:1", "http://127.0.0.1:2"]))
        b = Replica(store.url, pool=OTHER, resync_s=0.3)
        with caplog.at_level(logging.ERROR, logger="infer_ctl.router.state"):
            async with started(b):
                for i in range(4):
                    workers = ["http://127.0.0.1:1", "http://127.0.0.1:2", *(["http://127.0.0.1:7"] * (i % 2))]
                    put(store, FLEET, json.dumps(workers))
                    await asyncio.sleep(0.5)
                assert not b.sync.up and b.sync.records.applied == 0
                reg = b.router.metrics.registry
                # the store answered every look: not a store failure, and said as what it is
                assert reg.get_sample_value("inferctl_router_state_store_failures_total") == 0
                assert reg.get_sample_value("inferctl_router_state_store_another_fleet") == 1
                return b.sync.status_doc()

    doc = with_store(main)
    conflicts = [r for r in caplog.records if "another fleet" in r.getMessage()]
    assert len(conflicts) == 1, [r.getMessage() for r in caplog.records]
    assert doc["another_fleet"] is True

    class Client:
        def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
            return {"listen": "127.0.0.1:1", "mode": "pd", "policy": "kv", "workers": {"available": 2, "total": 2},
                    "active_requests": 0, "index": {"blocks": 0}, "prefixes": {"active": 0}, "state_store": doc}

    # the admin client stands in for the router; the command's own target (URL, profile) is the real one
    monkeypatch.setattr(admin_client, "AdminClient", lambda url, *a, **kw: Client())
    capsys.readouterr()
    assert main_cli(["router", "status", "--url", "http://127.0.0.1:1"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert "NOT USED, its namespace is another fleet's" in out and "UNREACHABLE" not in out, out


def test_rediss_to_a_server_whose_certificate_is_not_trusted_is_refused(tmp_path: Any) -> None:
    """rediss:// to a TLS redis-server with a self-signed certificate: no connection (never plaintext,
    never unverified), the store shown down with the reason, admin changes refused."""
    import shutil
    import subprocess

    need_redis()
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    from tests.sim.kv_client import free_port

    port = free_port()
    proc = subprocess.Popen([str(RedisServer().binary), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                             "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-auth-clients", "no",
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(0.5)
        if proc.poll() is not None:
            pytest.skip(f"this redis-server has no TLS: {proc.stderr.read().decode()[-200:] if proc.stderr else ''}")

        async def main() -> None:
            r = Replica(f"rediss://127.0.0.1:{port}/0")
            await r.sync.start()
            try:
                assert not r.sync.up
                assert "certificate" in (r.sync.error or "").lower(), r.sync.error
                with pytest.raises(StoreUnavailable, match="not made on any replica"):
                    await r.sync.change_prefix("p", register("p", "x"))
            finally:
                await r.sync.stop()

        asyncio.run(main())
    finally:
        proc.kill()
        proc.wait(10)


def test_a_10_mb_prefix_record_from_the_store_does_not_slow_every_request() -> None:
    """A record with a 10 MB text lands in the store (an operator's mistake or a hostile writer) and every
    replica loads it. Before: `match` stripped a copy of every record's text on every request, 3 ms a
    request on this machine. Now the key is computed once per record."""

    async def body(store: RedisServer, a: Replica, b: Replica) -> None:
        c = store.client()
        huge = record(7, "huge", "You are a verbose assistant. " * 360_000 + "\n")
        raw = json.dumps(huge, separators=(",", ":"))
        assert len(raw) > 10_000_000
        c.hset(HASH, "prefix:huge", raw)
        c.publish(CHANNEL, raw)
        assert await until(lambda: bool(a.texts("huge")), timeout=5)
        reg = a.router.prefixes
        reg.register("sys", "You are helpful. ", now=0.0)
        reg.match("You are helpful. first")
        t0 = time.perf_counter()
        for _ in range(50):
            assert reg.match("You are helpful. hello") is not None
        per_call = (time.perf_counter() - t0) / 50
        assert per_call < 0.0003, f"{per_call * 1000:.2f} ms a match"
        c.close()

    run_pair(body)


def test_a_replica_started_while_the_store_is_down_serves_then_seeds_it_when_it_appears() -> None:
    """No redis-server yet: the replica starts (down, admin changes refused as not made), and when the
    store appears on that address it connects within a second or two and seeds its prefixes and workers."""
    need_redis()
    store = RedisServer()  # its port, nothing listening yet

    async def main() -> None:
        r = Replica(store.url)
        r.router.prefixes.register("from-profile", "text", now=r.router.clock())
        await r.sync.start()
        try:
            assert not r.sync.up and r.sync.error
            with pytest.raises(StoreUnavailable, match="not made on any replica"):
                await r.sync.change_prefix("p", register("p", "x"))
            await asyncio.to_thread(store.start)
            assert await until(lambda: r.sync.up, timeout=3)
            c = store.client()
            assert sorted(c.hkeys(HASH)) == ["prefix:from-profile", "worker:http://127.0.0.1:1",
                                             "worker:http://127.0.0.1:2"]
            c.close()
            await r.sync.change_prefix("p", register("p", "x"))
        finally:
            await r.sync.stop()

    try:
        asyncio.run(main())
    finally:
        store.stop()
