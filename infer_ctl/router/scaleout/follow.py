"""Leader and followers of a multi-process router (`router serve --processes N`, router/daemon/procs.py).

Process 0, the leader, owns what the operator changes: the worker list (add, remove, drain) and the named
prefixes (register, warm, expire, TTL; the warmer runs there only), all through the admin API, which only
the leader serves (every process's front relays /admin/ to the leader's unix socket). The leader writes
that state as a versioned snapshot (`state.json` in the router's private state directory, written
atomically: temp file, fsync, rename) whenever it changed, checked every `SYNC_S`; each follower stats the
file every `SYNC_S` and applies a newer version. An admin change is in force in every process within
two periods plus the write (well under 1 s). The snapshot carries neither traffic statistics nor
per-request timestamps, so it changes only when the operator's state does, never per request.

What every process keeps for itself: health checks (each process's predicted index, KV-event streams and
upstream connections are its own, so each repairs its own), the KV-event subscriptions, the predicted
index and the circuit breakers. Timestamps in the snapshot are `time.monotonic()`, CLOCK_MONOTONIC,
which is one clock for every process on the machine. A leader that restarts adopts the last snapshot,
so runtime changes survive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer_ctl.atomicfile import write_atomic
from infer_ctl.core.routing.prefixes import Placement, PrefixRecord, PrefixState
from infer_ctl.router.config import WorkerSpec
from infer_ctl.router.http.jsonio import dumps, loads
from infer_ctl.router.request.proxy import Router

log = logging.getLogger("infer_ctl.router")

#: how often the leader checks for a change and a follower for a new snapshot
SYNC_S = 0.1
#: every how many checks the leader serializes its state even though no change was counted: a change
#: made past the counters (a field set directly) is still published within a second
_FULL_EVERY = 10
#: how often a follower expires its predicted index (the leader's warmer does it there)
_EXPIRE_S = 0.5


@dataclass(frozen=True)
class ProcessRole:
    """One router process's place among the supervisor's `processes`."""

    index: int
    processes: int
    state_dir: str
    shm_name: str
    slots: int

    @property
    def leader(self) -> bool:
        return self.index == 0

    @property
    def admin_sock(self) -> str:
        return os.path.join(self.state_dir, "admin.sock")

    @property
    def snapshot(self) -> Path:
        return Path(self.state_dir) / "state.json"

    def ready_file(self, index: int) -> Path:
        return Path(self.state_dir) / f"ready-{index}"

    def metrics_file(self, index: int) -> Path:
        return Path(self.state_dir) / f"metrics-{index}.prom"


def forget_worker(router: Router, url: str) -> None:
    """Take a worker out of every part of one process's state (the admin API's remove, a follower's
    snapshot)."""
    router.workers.remove(url)
    router.kv.forget(url)
    router.pairs.forget(url)
    router.spec.drop(url)
    router.index.drop_worker(url)
    router.prefixes.drop_worker(url)
    router.upstreams.drop(url)
    router.coalesce.worker_down(url)


# ---- the snapshot ---------------------------------------------------------------------------------
def _record_doc(r: PrefixRecord) -> dict[str, Any]:
    return {"name": r.name, "text": r.text, "version": r.version, "registered_at": r.registered_at,
            "ttl_s": r.ttl_s, "replicas": r.replicas, "pin": r.pin, "fmt": r.fmt, "keep": r.keep,
            "tokens": r.tokens, "state": r.state.value, "ended_at": r.ended_at, "avoid": sorted(r.avoid),
            "placements": {u: {"warmed_at": p.warmed_at, "warming": p.warming, "needs_rewarm": p.needs_rewarm,
                               "warm_failures": p.warm_failures, "left_streak": p.left_streak, "tier": p.tier}
                           for u, p in r.placements.items()}}


def _record(d: dict[str, Any]) -> PrefixRecord:
    rec = PrefixRecord(name=d["name"], text=d["text"], version=d["version"], registered_at=d["registered_at"],
                       ttl_s=d["ttl_s"], replicas=d["replicas"], pin=d["pin"], fmt=d["fmt"], keep=d.get("keep"),
                       tokens=d["tokens"],
                       state=PrefixState(d["state"]), ended_at=d["ended_at"], avoid=set(d["avoid"]))
    rec.placements = {u: Placement(worker=u, **p) for u, p in d["placements"].items()}
    return rec


def snapshot_doc(router: Router) -> dict[str, Any]:
    """The leader's operator state (no version): worker list with slots and drain flags, named prefixes."""
    ws = router.workers
    return {
        "next_slot": ws.next_slot,
        "workers": [{"url": w.url, "role": w.role, "bootstrap_port": w.spec.bootstrap_port, "slot": w.slot,
                     "draining": w.draining} for w in ws.all()],
        "prefixes": [_record_doc(r) for r in router.prefixes.records()],
    }


def _checked(doc: Any) -> tuple[list[dict[str, Any]], int, dict[str, list[PrefixRecord]]]:
    """The snapshot's workers, next slot and prefix records, or ValueError: the whole document is checked
    before any of it is applied, so a corrupt file (hand-edited, another version's) changes nothing."""
    try:
        workers = doc["workers"]
        if not isinstance(workers, list):
            raise TypeError("workers is not a list")
        for d in workers:
            if not (isinstance(d["url"], str) and d["role"] in ("prefill", "decode", "mixed")
                    and (d["slot"] is None or (isinstance(d["slot"], int) and d["slot"] >= 0))
                    and isinstance(d["draining"], bool)
                    and (d["bootstrap_port"] is None or isinstance(d["bootstrap_port"], int))):
                raise TypeError(f"bad worker entry {d!r:.200}")
        next_slot = int(doc.get("next_slot", 0))
        records: dict[str, list[PrefixRecord]] = {}
        for d in doc["prefixes"]:
            if not (isinstance(d["name"], str) and isinstance(d["text"], str)):
                raise TypeError(f"bad prefix entry {d!r:.200}")
            records.setdefault(d["name"], []).append(_record(d))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a router state snapshot: {type(exc).__name__}: {exc}") from None
    return workers, next_slot, records


def apply_snapshot(router: Router, doc: dict[str, Any], on_added: Any = None) -> None:
    """Make one process's worker list and named prefixes the snapshot's (ValueError: a corrupt snapshot,
    nothing applied)."""
    workers, next_slot, records = _checked(doc)
    ws = router.workers
    if ws.shared is not None and any(d["slot"] is None or d["slot"] >= ws.shared.slots for d in workers):
        raise ValueError(f"not a router state snapshot: a worker without a slot or beyond the {ws.shared.slots} "
                         "shared ones")
    want = {d["url"]: d for d in workers}
    for url in [u for u in ws.by_url if u not in want or (ws.shared is not None and ws.by_url[u].slot != want[u]["slot"])]:
        # a worker removed and added again between two polls has a new slot: its old cell is no longer
        # summed by anyone, so this process's in-flight count there would be invisible to the others
        forget_worker(router, url)
        log.info("worker removed (leader)", extra={"worker": url})
    for url, d in want.items():
        w = ws.by_url.get(url)
        if w is None:
            w = ws.add(WorkerSpec(url, d["role"], d["bootstrap_port"]), slot=d["slot"])
            log.info("worker added (leader)", extra={"worker": url, "slot": d["slot"]})
            if on_added is not None:
                on_added(w)
        w.draining = d["draining"]
    ws.next_slot = max(ws.next_slot, next_slot)
    router.prefixes.adopt(records)


def read_snapshot(path: Path) -> dict[str, Any] | None:
    try:
        doc = loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return doc if isinstance(doc, dict) else None


# ---- the two loops --------------------------------------------------------------------------------
class Publisher:
    """The leader: writes the snapshot when the operator state changed."""

    def __init__(self, router: Router, path: Path) -> None:
        self.router = router
        self.path = path
        self.version = 0
        self._last = b""
        #: what the state's change counters said at the last serialization (None: never serialized)
        self._key: tuple[Any, ...] | None = None
        self._unforced = 0
        self._task: asyncio.Task[None] | None = None

    def _change_key(self) -> tuple[Any, ...]:
        """Cheap to compute, and different whenever the snapshot is: the named prefixes' change counter
        (PrefixRegistry.changes: the prefix documents, texts included, are what costs to serialize) and
        the worker fields the snapshot carries (a few per worker, set from several places)."""
        ws = self.router.workers
        return (self.router.prefixes.changes, ws.next_slot,
                tuple([(w.url, w.role, w.spec.bootstrap_port, w.slot, w.draining) for w in ws.all()]))

    def adopt(self) -> bool:
        """A restarted leader: take over the last snapshot (runtime changes survive the restart)."""
        try:
            doc = read_snapshot(self.path)
            if doc is None:
                return False
            apply_snapshot(self.router, doc)
            self.version = int(doc.get("version", 0))
            # the dead leader's warm-ups died with it: a placement adopted as `warming` would never be
            # warmed again (plan_warmups skips it, and no warm_done will ever come)
            for rec in self.router.prefixes.records():
                for p in rec.placements.values():
                    p.warming = False
        except (OSError, ValueError) as exc:  # a corrupt file must not crash-loop the leader (and the router)
            log.error("cannot adopt the last snapshot: starting from the profile", extra={"error": str(exc)})
            return False
        log.warning("leader adopted the last snapshot", extra={"version": self.version})
        return True

    def publish(self, force: bool = True) -> bool:
        """Write the snapshot when the state differs from the last one written. `force=False` (the
        100 ms loop): serialize only when a change counter moved, or every `_FULL_EVERY` checks (an
        idle leader with 24 named prefixes of 1,200 tokens spent ~200 µs per check serializing)."""
        key = self._change_key()
        if not force and key == self._key and self._unforced < _FULL_EVERY - 1:
            self._unforced += 1
            return False
        self._key, self._unforced = key, 0
        data = dumps(snapshot_doc(self.router))
        if data == self._last:
            return False
        self.version += 1
        write_atomic(self.path, b'{"version":%d,' % self.version + data[1:], mode=0o600,
                     make_parents=False)  # a removed state directory is not made again (world-readable)
        self._last = data
        return True

    def publish_now(self) -> None:
        """After an admin change, before its answer (admin.py): the 100 ms loop alone would lose a change
        acknowledged in the last period before the leader's death (its successor adopts the file)."""
        try:
            self.publish()
        except OSError as exc:
            log.warning("cannot write the router's state snapshot", extra={"error": str(exc)})

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(SYNC_S)
            try:
                self.publish(force=False)
            except OSError as exc:
                log.warning("cannot write the router's state snapshot", extra={"error": str(exc)})

    async def stop(self) -> None:
        await _cancel(self._task)


class Follower:
    """A follower: applies each newer snapshot, and expires its predicted index."""

    def __init__(self, router: Router, path: Path, on_added: Any = None) -> None:
        self.router = router
        self.path = path
        self.on_added = on_added
        self.version = 0
        self._stamp: tuple[int, int] | None = None
        self._task: asyncio.Task[None] | None = None

    def poll(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        stamp = (st.st_ino, st.st_mtime_ns)  # every write is a rename: a new inode
        if stamp == self._stamp:
            return False
        doc = read_snapshot(self.path)
        self._stamp = stamp
        if doc is None or int(doc.get("version", 0)) <= self.version:
            return False
        apply_snapshot(self.router, doc, self.on_added)
        self.version = int(doc["version"])
        return True

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        last_expire = 0.0
        while True:
            await asyncio.sleep(SYNC_S)
            try:
                self.poll()
            except Exception as exc:
                log.warning("cannot apply the leader's state snapshot", extra={"error": f"{type(exc).__name__}: {exc}"})
            now = self.router.clock()
            if now - last_expire >= _EXPIRE_S:
                self.router.index.expire(now)
                last_expire = now

    async def stop(self) -> None:
        await _cancel(self._task)


async def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
