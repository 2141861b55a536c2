"""Several router replicas, one fleet: the operator's changes shared through Redis (docs/router.md,
"Several replicas").

What replicas must agree on is what an operator changes at runtime: named prefixes (add, new version,
renewal, expire, warm, remove) and workers (add, remove, drain, undrain). What they agree on without
this module: the exact index (each replica subscribes to every prefill's KV events) and the global load
(each polls every worker's /v1/loads). What stays each replica's own: the predicted index, its in-flight
counts, prefix statistics and warm-up progress.

The store: one hash per fleet (`inferctl:router:{<profile name>}:state`), a field per object
(`prefix:NAME`, `worker:URL`) holding `{"rev": N, "kind", "key", "record"}`, where N comes from one
INCR counter, so every change has a fleet-wide order. A change is one Lua script (atomic in Redis):
compare the stored value with the one the change was computed from, INCR, HSET, PUBLISH the same value.
A prefix change is computed on the stored record (not on this replica's copy) in a scratch registry with
the same verbs a single router runs, so two replicas changing one name at once cannot lose either
change: the second's compare fails and it recomputes on the first's result. Every replica applies a
record only when its rev is above the one it holds for that field (messages and resyncs may overlap),
subscribes before it loads the whole hash (nothing falls between the two), and reloads it every
`resync_s` (a missed message heals within that). The namespace is the profile's name; a replica with no
worker in common with the fleet that last synced there stays off the store (`_check_fleet`).

Times are stored absolute, on the store's clock (Redis TIME, measured at every sync): each replica
converts them to its own monotonic clock, so TTL expiry happens at the same moment everywhere, whatever
the hosts' wall clocks say. A removed
name is kept as a tombstone record, so a replica that missed the message, or one restarting with the
name in its profile, does not bring it back. A store that comes back empty (restarted without
persistence: a new `epoch` key) is re-seeded with what the replicas hold; one that comes back older (a
snapshot) gets back what the replicas hold newer. The subscription is pinged: one that went silent with
its socket open is replaced.

Store unreachable: every replica keeps serving with the state it has, shows it (`/admin/status`
`state_store`, `inferctl_router_state_store_up` 0) and answers admin changes with 503: a change made
on one replica only would be the divergence this module exists to prevent.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import os
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.errors import UsageError
from infer_ctl.router.http.jsonio import dumps, loads
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout.replica_records import ReplicaRecords, parse
from infer_ctl.router.scaleout.store_status import FleetConflict, StoreClock, StoreHealth

log = logging.getLogger("infer_ctl.router.state")

#: compare-and-set of one field; KEYS: hash, rev counter, epoch; ARGV: field, the SHA-1 of the stored value
#: the change was computed from ("": none; "*": any), the value after its rev (`"kind":...}`), channel,
#: expected epoch, the highest rev the writer holds. Returns the new rev, -1 when the field moved on
#: (recompute), -2 when the store is not the one this replica synced with (resync).
#: The comparison is of the stored value itself, not of a rev parsed out of it: a record in another
#: spelling (written by another tool) or garbage must not make every change of that name fail. The new
#: rev is above the counter, the stored record's rev and every rev the writer holds: a record left with
#: a rev from elsewhere, or a store restored from an older snapshot (its counter behind the replicas'),
#: would otherwise get a rev every replica ignores as old.
_CAS = """
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return -2 end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] ~= '*' then
  local have = ''
  if cur then have = redis.sha1hex(cur) end
  if have ~= ARGV[2] then return -1 end
end
local v = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[6]) or 0
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if ok and type(doc) == 'table' and type(doc.rev) == 'number' and doc.rev > floor and doc.rev < 2^53 then
    floor = doc.rev
  end
end
if v <= floor then
  v = floor + 1
  redis.call('SET', KEYS[2], string.format('%d', v))
end
local value = '{"rev":' .. string.format('%d', v) .. ',' .. ARGV[3]
redis.call('HSET', KEYS[1], ARGV[1], value)
redis.call('PUBLISH', ARGV[4], value)
return v
"""
#: the fleet check (`StateSync._check_fleet`), one script so that two replicas of different fleets syncing at
#: once cannot both find the namespace free (a GET then a SET would let both in, each seeding its workers
#: and prefixes into the other's state). KEYS: the fleet key; ARGV: its expiry (s), the marker to write, then
#: this replica's workers. Returns the stored marker when it is another fleet's (a non-empty list of URLs,
#: none of them this replica's), writing nothing; else writes the marker and returns nil. A marker that is
#: not such a list (garbage, a dict, written by hand) is taken over.
_FLEET = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local ok, theirs = pcall(cjson.decode, cur)
  if ok and type(theirs) == 'table' and #theirs > 0 then
    local ours = {}
    for i = 3, #ARGV do ours[ARGV[i]] = true end
    local wellformed, shared = true, false
    for _, u in ipairs(theirs) do
      if type(u) ~= 'string' then wellformed = false elseif ours[u] then shared = true end
    end
    if wellformed and not shared then return cur end
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[1])
return false
"""


#: the subscription is pinged this often and taken for dead after this long without a word on it
PING_S = 0.5
SILENT_S = 2.0


class _Silent(Exception):
    """The subscription stopped answering while its socket looks open."""


class VerbRefused(Exception):
    """An operator verb refused the change (bad settings, unknown name): answered as `status`."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def redact(url: str) -> str:
    """The store's URL without credentials (the profile never holds a password, a URL given in code may)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


PrefixVerb = Callable[[PrefixRegistry, float], Any]


class StateSync:
    """The store's side of the shared state: the connection, the listening loop, the syncs, the fleet check
    and the compare-and-set writes of the admin API's changes. What a record does to this router, and which
    revs it holds: `records` (replica_records.py)."""

    def __init__(self, router: Router, records: ReplicaRecords, *, url: str, password: str | None, namespace: str,
                 resync_s: float = 5.0, timeout_s: float = 1.0, wall: Callable[[], float] = time.time) -> None:
        """`router`'s prefixes must place on shared terms (PrefixRegistry `shared_placement`: replicas place a
        prefix on the same workers, by rendezvous hash, not by their own load view): the assembly
        (router/daemon/assembly.py) builds them so with a state store. `wall`: this host's wall clock (a
        test gives a skewed one); absolute times are read on the store's clock."""
        if importlib.util.find_spec("redis") is None:
            raise UsageError("router.state_store is set but the Redis client (python package redis) is not installed",
                             remedy="pip install 'inferctl[replicas]'")
        self.router = router
        self.records = records
        self.url = url
        self.password = password
        self.resync_s = resync_s
        self.timeout_s = timeout_s
        ns = f"inferctl:router:{{{namespace}}}"  # one hash tag: every key in one Redis Cluster slot
        self.namespace = namespace
        self.hash_key, self.rev_key, self.epoch_key, self.channel = (f"{ns}:state", f"{ns}:rev", f"{ns}:epoch",
                                                                     f"{ns}:changes")
        self.fleet_key = f"{ns}:fleet"
        self.epoch: str | None = None
        self.health = StoreHealth(redact(url), router.metrics.registry)
        self.store_clock = StoreClock(router.clock, wall, redact(url))
        self.last_sync: float | None = None
        self._client: Any = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one change at a time from this replica (each is a few round trips)
        self._cas: Any = None
        self._fleet_script: Any = None
        self._resync_due = False
        self._stopping = False
    @property
    def up(self) -> bool:
        return self.health.up

    @property
    def error(self) -> str | None:
        return self.health.error

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        import redis.asyncio as aioredis  # only with a state store: a single router never loads redis

        self._client = aioredis.from_url(self.url, password=self.password, socket_timeout=self.timeout_s,
                                         socket_connect_timeout=self.timeout_s, decode_responses=True,
                                         # a value that is not UTF-8 reads back byte for byte (its SHA-1 for
                                         # the compare-and-set), then is ignored as malformed
                                         encoding_errors="surrogateescape")
        self._cas = self._client.register_script(_CAS)
        self._fleet_script = self._client.register_script(_FLEET)
        try:
            async with asyncio.timeout(3 * self.timeout_s):
                await self._sync("start")
        except Exception as exc:  # any failure: serve with the profile's state, retry below
            self.health.down(exc)
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            # redis-py's pub/sub can swallow a cancellation (seen with a PING on the subscription in
            # flight): cancel again until the task is done; the loop also ends on `_stopping`
            for _ in range(40):
                self._task.cancel()
                done, _ = await asyncio.wait({self._task}, timeout=0.25)
                if done:
                    break
            if self._task.done() and not self._task.cancelled() and self._task.exception() is not None:
                log.warning("state store loop ended with an error", extra={"error": repr(self._task.exception())})
        if self._client is not None:
            await self._client.aclose()

    def status_doc(self) -> dict[str, Any]:
        now = time.monotonic()
        return {"url": redact(self.url), "namespace": self.namespace, "connected": self.up, "error": self.error,
                "another_fleet": self.health.conflict,
                "epoch": self.epoch, "rev": self.records.max_rev(), "applied": self.records.applied,
                "last_sync_s_ago": None if self.last_sync is None else round(now - self.last_sync, 1),
                "clock_skew_s": None if (skew := self.store_clock.skew(now)) is None else round(skew, 3),
                "replicas": list(self.router.cfg.settings.replicas)}

    # ---- the listening loop ----------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            pause = 0.0
            try:
                await pubsub.subscribe(self.channel)
                await self._sync("resync")  # after subscribing: a change between the two is in one or the other
                next_sync = time.monotonic() + self.resync_s
                heard = next_ping = time.monotonic()
                while not self._stopping:
                    now = time.monotonic()
                    wait = min(1.0, next_sync - now, next_ping - now)
                    msg = await pubsub.get_message(timeout=max(0.05, wait))
                    now = time.monotonic()
                    if msg is not None:
                        heard = now
                        if msg.get("type") == "message":
                            self._apply_raw(msg["data"], "message")
                    if now >= next_ping:
                        # a subscription can die without its socket saying so (a firewall or NAT that drops
                        # the connection silently): the store answers a PING on it, so silence means dead
                        await pubsub.ping()
                        next_ping = now + PING_S
                    if now - heard > SILENT_S:
                        raise _Silent(f"no answer on the subscription for {now - heard:.1f} s")
                    if self._resync_due or now >= next_sync:
                        self._resync_due = False
                        await self._sync("resync")
                        next_sync = time.monotonic() + self.resync_s
            except asyncio.CancelledError:
                raise
            except _Silent as exc:  # the store itself may be fine: subscribe again, and resync what was missed
                self.health.failed()
                log.warning("state store subscription silent: subscribing again",
                            extra={"store": redact(self.url), "error": str(exc)})
                continue
            except FleetConflict as exc:  # nothing to retry soon: the other fleet is not going away
                self.health.down(exc)
                pause = max(0.0, self.resync_s - 0.5)  # waited unsubscribed, below: its changes are not ours
            except Exception as exc:  # redis-py raises its own and OS errors: retry all
                self.health.down(exc)
            finally:
                try:
                    async with asyncio.timeout(self.timeout_s):
                        await asyncio.shield(pubsub.aclose())
                except Exception:  # the connection is gone already
                    pass
            await asyncio.sleep(pause + min(0.5, self.resync_s))

    def wall_offset(self) -> float:
        """What to add to router.clock() for the absolute time records carry (StoreClock)."""
        return self.store_clock.wall_offset()

    async def _measure_clock(self) -> None:
        clock = self.router.clock
        t0 = clock()
        sec, usec = await self._client.time()
        self.store_clock.measured(t0, sec + usec / 1e6, clock())

    async def _sync(self, source: str) -> None:
        """Load the whole hash; adopt (or create) the store's epoch; seed what the store lacks, and write
        back what it holds older than this replica (a restore from an older snapshot)."""
        client = self._client
        await self._measure_clock()
        await self._check_fleet()
        epoch = await client.get(self.epoch_key)
        if epoch is None:
            await client.set(self.epoch_key, os.urandom(8).hex(), nx=True)
            epoch = await client.get(self.epoch_key)
        fresh = epoch != self.epoch
        if fresh:
            if self.epoch is not None:
                log.warning("state store has a new epoch (restarted empty?): re-seeding it with this replica's state",
                            extra={"store": redact(self.url), "old": self.epoch, "new": epoch})
            self.records.revs.clear()
            self.epoch = epoch
        async with self._lock:  # read under the lock: a change this replica makes meanwhile is in it
            values = await client.hgetall(self.hash_key)
            for raw in values.values():
                self._apply_raw(raw, source)
            if fresh:
                await self._seed(values)
            else:
                await self._write_back(values)
        self.last_sync = time.monotonic()
        self.health.connected(self.epoch)

    async def _check_fleet(self) -> None:
        """The namespace is the profile's name: two fleets whose profiles share a name and a store would share
        one state, each adding the other's workers to its pool and removing its prefixes. The store keeps the
        workers of the last replica to sync (for 6 resyncs); a replica none of whose workers is among them is
        of another fleet: it stays off the store, serving with its own state, and says why. A replica's
        workers are those it was started with and those the shared state lists as present: one fleet's
        replicas share workers even while a worker is added, or all of them are replaced at runtime (a
        replica started with the new list, while the others were started with the old one)."""
        ours = self.records.fleet_workers()
        if not ours:  # started with none, nothing learnt yet: nothing to compare
            return
        ttl = max(30, int(6 * self.resync_s))  # it lapses: once every replica of a fleet is gone, the next owns it
        raw = await self._fleet_script(keys=[self.fleet_key], args=[ttl, dumps(ours), *ours])
        if raw is None:
            return
        try:
            theirs = [str(u) for u in loads(raw)]  # the script found it a list of strings
        except ValueError:  # strings Redis's cjson takes and JSON does not (not UTF-8): written by hand
            theirs = [f"{raw!r} (not UTF-8)"]
        # bounded: the reason is logged and shown in the status (a marker written by hand can be anything)
        shown = ", ".join(u[:100] for u in theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
        raise FleetConflict(
            f"namespace {self.namespace!r} of the state store is in use by another fleet (workers {shown}; "
            f"none of this replica's): two fleets whose profiles are both named {self.namespace!r} share "
            "this store. Rename one profile, or give it its own router.state_store database")

    async def _seed(self, stored: dict[str, str]) -> None:
        """Write what this replica holds that the store does not know (ReplicaRecords.unseeded). Another
        replica seeding the same name first wins: its record is then applied here."""
        for kind, key, doc in self.records.unseeded(stored, self.wall_offset()):
            await self._put(kind, key, doc, None)

    async def _write_back(self, stored: dict[str, str]) -> None:
        """Same epoch, but the store holds a field older than this replica does, or not at all: write what
        this replica holds (the fleet's latest, as far as it knows); the first replica to do so wins."""
        for kind, key, doc, raw in self.records.newer_than_stored(stored, self.wall_offset()):
            await self._put(kind, key, doc, raw)

    async def _put(self, kind: str, key: str, doc: dict[str, Any], stored_raw: str | None) -> None:
        """Write `doc` unless the field changed from `stored_raw` meanwhile (then apply what is there)."""
        rev = await self._write(kind, key, doc, expected=_sha(stored_raw))
        if rev > 0:
            self.records.written(kind, key, doc, rev)
        else:
            self._apply_raw(await self._client.hget(self.hash_key, f"{kind}:{key}"), "resync")

    def _apply_raw(self, raw: str | None, source: str) -> None:
        self.records.apply_raw(raw, source, self.wall_offset())

    async def _write(self, kind: str, key: str, record: dict[str, Any], expected: str | None) -> int:
        rest = dumps({"kind": kind, "key": key, "record": record}).decode()[1:]  # the object after its "{"
        rev = await self._cas(keys=[self.hash_key, self.rev_key, self.epoch_key],
                              args=[f"{kind}:{key}", "*" if expected is None else expected, rest, self.channel,
                                    self.epoch or "", str(self.records.max_rev())])
        return int(rev)

    # ---- admin changes ---------------------------------------------------------------------------
    async def change_prefix(self, name: str, verb: PrefixVerb) -> Any:
        """Run an operator verb on the stored record of `name` and write the result fleet-wide; it is in
        force here when this returns. `verb(registry, now)` raises VerbRefused to refuse, changing nothing. Returns this replica's view of the verb's result."""
        if not self.up:
            raise self.health.refusal()
        router = self.router
        field = f"prefix:{name}"
        sent = False
        try:
            async with self._lock:
                async with asyncio.timeout(5 * self.timeout_s):
                    for _ in range(16):
                        raw = await self._client.hget(self.hash_key, field)
                        now, offset = router.clock(), self.wall_offset()
                        scratch = self.records.scratch()
                        value = parse(raw)
                        try:
                            scratch.load_name(name, value[3] if value else None, offset)
                        except ValueError as exc:  # a record nobody can read: the change replaces it
                            log.warning("malformed prefix record replaced", extra={"prefix": name, "error": str(exc)})
                            scratch = self.records.scratch()
                        scratch.tick(now)  # a TTL lapsed since the last write counts as it does locally
                        result = verb(scratch, now)
                        doc = scratch.export_name(name, offset)
                        sent = True
                        rev = await self._write("prefix", name, doc, expected=_sha(raw))
                        sent = False
                        if rev == -2:
                            self._resync_due = True
                            raise ConnectionError("the store's epoch changed (it restarted); resyncing")
                        if rev > 0:
                            self._apply_raw(dumps({"rev": rev, "kind": "prefix", "key": name, "record": doc}).decode(),
                                            "local")
                            return result
                    raise ConnectionError("the record kept changing under 16 attempts")
        except VerbRefused:
            raise
        except Exception as exc:  # redis-py's errors, OS errors, the timeout
            self.health.down(exc)
            raise (self.health.unknown("prefixes") if sent else self.health.refusal()) from None

    async def change_worker(self, url: str, record: dict[str, Any]) -> None:
        """Write a worker's new state fleet-wide (last writer wins) and apply it here."""
        if not self.up:
            raise self.health.refusal()
        try:
            async with self._lock:
                async with asyncio.timeout(3 * self.timeout_s):
                    rev = await self._write("worker", url, record, expected=None)
            if rev <= 0:
                self._resync_due = True
                raise ConnectionError("the store's epoch changed (it restarted); resyncing")
        except ConnectionError as exc:
            self.health.down(exc)
            raise self.health.refusal() from None
        except Exception as exc:
            self.health.down(exc)
            raise self.health.unknown("workers") from None
        await self.records.apply_local_worker(url, record, rev)


def _sha(raw: str | None) -> str:
    """What the compare-and-set compares: the SHA-1 of the stored value's bytes ("" when there is none)."""
    return "" if raw is None else hashlib.sha1(raw.encode("utf-8", "surrogateescape")).hexdigest()
