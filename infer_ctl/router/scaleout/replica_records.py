"""Several router replicas: this replica's side of the shared state (state_sync.py talks to the store).

Which rev of each stored field this replica holds, the worker records it applied, and applying a stored
record to the router: a named prefix into its registry, a worker change through `apply_worker` (the admin
API's WorkerChanges). Also what this replica writes to a store that lacks or lost its records. No I/O:
times in records are absolute on the store's clock, and every method that converts them is given the
offset (`offset`: what to add to the router's clock; StateSync measures it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Counter

from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.router.http.jsonio import loads
from infer_ctl.router.request.proxy import Router

log = logging.getLogger("infer_ctl.router.state")

#: revs above this are not ours (Lua numbers are doubles): such a record is ignored as malformed
MAX_REV = 2**53

WorkerApply = Callable[[str, dict[str, Any]], Awaitable[None]]
#: one stored record: (rev, kind, key, record)
Stored = tuple[int, str, str, Any]


def parse(raw: str | None) -> Stored | None:
    """(rev, kind, key, record) of a stored value, or None when absent or malformed."""
    if raw is None:
        return None
    try:
        value = loads(raw)
        rev, kind, key, record = int(value["rev"]), value["kind"], str(value["key"]), value["record"]
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("malformed state record ignored", extra={"error": str(exc), "record": str(raw)[:200]})
        return None
    if not 0 < rev < MAX_REV or kind not in ("prefix", "worker"):
        log.warning("malformed state record ignored", extra={"rev": rev, "kind": str(kind)[:40]})
        return None
    return rev, kind, key, record


class ReplicaRecords:
    def __init__(self, router: Router, *, apply_worker: WorkerApply, on_prefix_change: Callable[[], None]) -> None:
        self.router = router
        self.apply_worker = apply_worker
        self.on_prefix_change = on_prefix_change
        #: the workers this replica was started with (its profile's, or its flags'), before the store adds any
        self.fleet = sorted(w.url for w in router.workers.all())
        #: the rev held per field (`prefix:NAME`, `worker:URL`)
        self.revs: dict[str, int] = {}
        #: the last worker record applied per URL: what this replica writes back to a store that lost it
        self.worker_records: dict[str, dict[str, Any]] = {}
        self.applied = 0
        self._changes = Counter("inferctl_router_state_changes_total",
                                "Shared changes applied, by kind (prefix, worker) and source (local, message, resync)",
                                ["kind", "source"], registry=router.metrics.registry)

    def max_rev(self) -> int:
        return max(self.revs.values(), default=0)

    def fleet_workers(self) -> list[str]:
        """The workers this replica was started with, and those present in the shared state it applied."""
        held = {url for url, rec in self.worker_records.items() if rec.get("present")}
        return sorted(held | set(self.fleet))

    def scratch(self) -> PrefixRegistry:
        """An empty registry with this router's settings, for running a verb on a stored record."""
        prefixes = self.router.prefixes
        return PrefixRegistry(rewarm_idle_s=prefixes.rewarm_idle_s, shared_placement=prefixes.shared_placement,
                              pin_touch_s=prefixes.pin_touch_s, forget_after_s=prefixes.forget_after_s)

    # ---- applying records ------------------------------------------------------------------------
    def apply_raw(self, raw: str | None, source: str, offset: float) -> None:
        value = parse(raw)
        if value is None:
            return
        rev, kind, key, record = value
        field = f"{kind}:{key}"
        if rev <= self.revs.get(field, 0):
            return
        if kind == "prefix":
            try:
                self.router.prefixes.load_name(key, record, offset)
            except ValueError as exc:
                log.warning("malformed prefix record ignored", extra={"prefix": key, "error": str(exc)})
                return
            self.revs[field] = rev
            self.on_prefix_change()
        elif isinstance(record, dict):
            self.revs[field] = rev
            self.worker_records[key] = record
            self.router.spawn(self.apply_worker(key, record))
        else:
            return
        self._count(kind, key, rev, source)

    async def apply_local_worker(self, url: str, record: dict[str, Any], rev: int) -> None:
        """This replica's own worker change, written as `rev`: applied here unless a later one (another
        replica's) arrived before this write's answer: that one is in force, here as everywhere."""
        field = f"worker:{url}"
        if self.revs.get(field, 0) > rev:
            log.info("shared change overtaken by a later one", extra={"kind": "worker", "key": url, "rev": rev})
            return
        self.revs[field] = rev
        self.worker_records[url] = record
        self._count("worker", url, rev, "local")
        await self.apply_worker(url, record)

    def written(self, kind: str, key: str, doc: dict[str, Any], rev: int) -> None:
        """This replica wrote `doc` (seeding or writing back what it holds) as `rev`."""
        field = f"{kind}:{key}"
        self.revs[field] = max(rev, self.revs.get(field, 0))
        if kind == "worker":
            self.worker_records[key] = doc

    def _count(self, kind: str, key: str, rev: int, source: str) -> None:
        self.applied += 1
        self._changes.labels(kind, source).inc()
        # one line per operator change and replica (rare): when it was in force here, on the wall clock
        log.info("shared change applied", extra={"kind": kind, "key": key, "rev": rev, "source": source,
                                                 "applied_at": round(time.time(), 4)})

    # ---- what the store lacks ----------------------------------------------------------------------
    def unseeded(self, stored: dict[str, str], offset: float) -> list[tuple[str, str, dict[str, Any]]]:
        """(kind, key, record) of the prefixes and workers this replica holds that the store does not know
        (its profile's, or all of them after the store lost everything). The workers too: a replica started
        with a worker the others lack (its profile or --prefill list differs) adds it fleet-wide instead of
        routing to a different set; the store's records (a worker removed or drained at runtime) win over
        what a replica was started with, as for prefixes."""
        router = self.router
        out: list[tuple[str, str, dict[str, Any]]] = [
            ("prefix", name, router.prefixes.export_name(name, offset))
            for name in sorted({r.name for r in router.prefixes.records()}) if f"prefix:{name}" not in stored]
        records = dict(self.worker_records)
        for w in router.workers.all():
            records.setdefault(w.url, {"present": True, **w.spec.as_dict(), "draining": w.draining})
        out += [("worker", url, rec) for url, rec in sorted(records.items()) if f"worker:{url}" not in stored]
        return out

    def newer_than_stored(self, stored: dict[str, str], offset: float) -> list[tuple[str, str, dict[str, Any], str | None]]:
        """(kind, key, record, stored value) of each field the store holds older than this replica does, or
        not at all, though in the same epoch: it went back in time (restored from an older snapshot, a field
        deleted by hand)."""
        out: list[tuple[str, str, dict[str, Any], str | None]] = []
        for field, held in sorted(self.revs.items()):
            raw = stored.get(field)
            value = parse(raw)
            if value is not None and value[0] >= held:
                continue
            kind, _, key = field.partition(":")
            if kind == "prefix":
                doc: dict[str, Any] = self.router.prefixes.export_name(key, offset)
            elif key in self.worker_records:
                doc = self.worker_records[key]
            else:
                continue
            log.warning("the state store holds an older record than this replica (restored from a snapshot?): "
                        "writing this replica's back", extra={"field": field, "held_rev": held,
                                                              "stored_rev": None if value is None else value[0]})
            out.append((kind, key, doc, raw))
        return out
