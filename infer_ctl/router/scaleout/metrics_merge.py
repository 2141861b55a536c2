"""/metrics of a multi-process router: every process answers for all of them.

A scrape lands on whichever process the kernel gave the connection to; answering with that process's
counters alone would make every scrape a different, partial view (rates that jump between processes).
So each process writes its own exposition to the state directory every `WRITE_S` (a rename: readers see
a whole file), and /metrics on any process merges its live exposition with the other processes' files:
one family per metric name (Prometheus refuses a family twice in one scrape), each sample labelled
`router_process="i"`. Sum over that label for the router's totals (`sum without (router_process)`).
The other processes' samples are at most `WRITE_S` old while they answer requests, and at most
`REFRESH_S` old while they answer none: an idle process only touches its file (rendering the
exposition every second was about 5 ms of CPU a second per process, most of an idle 2-process
router's cost). A process whose file is older than `STALE_S` (dead, being restarted) is left out
rather than reported frozen.

Families whose value is already the whole router's in every process are taken from the answering
process only and keep no process label: the per-worker in-flight gauge reads the shared load block
(router/fleet/shared_load.py), so adding the processes' copies would count each request N times.

Beside its exposition each process keeps a small JSON of the request counters `/admin/status` shows
(`counters`: request-path anchoring, coalescing), rewritten when they change, touched otherwise. The
admin API runs in the leader only (every process relays /admin/ to it), so the leader sums its own
counters with the other processes' files (`peer_counters`, `add_counters`), with the same staleness
rule as a scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Metric, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger("infer_ctl.router")

WRITE_S = 1.0
#: an idle process (no request answered since its last write) renders again after this long anyway:
#: health and KV-stream gauges move without requests
REFRESH_S = 5.0
STALE_S = 10.0
#: a counters file is a few hundred bytes: a bigger one is not a router process's and is not read
MAX_COUNTERS_BYTES = 1 << 16
LABEL = "router_process"
#: families that every process reports for the whole router already
WHOLE_ROUTER = frozenset({"inferctl_router_worker_inflight"})


def write_exposition(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # no fsync: a tmpfs-like scratch file, rewritten every second


def counters_file(metrics_file: Path) -> Path:
    """Where a process keeps its admin counters, beside its exposition (metrics-0.prom: metrics-0.json)."""
    return metrics_file.with_suffix(".json")


def add_counters(docs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The processes' counter documents added key by key (nested maps too), in the first one's shape
    (this process's own): another's key the first lacks, or a value of another type, is left out, so a
    file cannot add fields to /admin/status; a number that is not finite counts as none."""
    it = iter(docs)
    out = dict(next(it, {}))
    for doc in it:
        for k, have in out.items():
            v = doc.get(k)
            if isinstance(have, dict) and isinstance(v, dict):
                out[k] = add_counters([have, v])
            elif _number(have) and _number(v):
                out[k] = have + v
    return out


def _number(v: Any) -> bool:
    """A count another process could have written: a finite float, or an int a float can add."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -(1 << 63) <= v < 1 << 63
    return isinstance(v, float) and math.isfinite(v)


def _fresh(path: Path, now: float) -> bool:
    """Whether `path` was written (or touched) within STALE_S of `now`, either side: after the wall
    clock steps back, a dead process's file would otherwise read as fresh until the clock caught up
    with it (a live process's file is touched again within WRITE_S)."""
    return abs(now - path.stat().st_mtime) <= STALE_S


def merge(expositions: Iterable[tuple[int, str]], own: int) -> bytes:
    """One exposition from each process's (`index`, text); `own` is the answering process."""
    families: dict[str, Metric] = {}
    for index, text in expositions:
        try:
            parsed = list(text_string_to_metric_families(text))
        except (ValueError, TypeError, IndexError) as exc:
            if index == own:
                raise
            # another process's file that does not parse (not ours to trust): without it, not a 500
            log.warning("skipping a router process's metrics file that does not parse",
                        extra={"router_process": index, "error": str(exc)})
            continue
        for fam in parsed:
            whole = fam.name in WHOLE_ROUTER
            if whole and index != own:
                continue
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            for s in fam.samples:
                labels = s.labels if whole else {**s.labels, LABEL: str(index)}
                merged.samples.append(Sample(s.name, labels, s.value, s.timestamp, s.exemplar))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(list(families.values())))
    return generate_latest(registry)


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


class ProcessMetrics:
    """One process's side: write its exposition periodically; merge on a scrape."""

    def __init__(self, render: Callable[[], bytes], index: int, processes: int,
                 file_of: Callable[[int], Path], activity: Callable[[], int] = lambda: 0,
                 counters: Callable[[], dict[str, Any]] | None = None) -> None:
        self.render = render
        #: this process's admin counters (control/admin_status.py `process_counters`), kept for the leader's /admin/status
        self.counters = counters
        self._counters_written: str | None = None
        #: a count that moves with every answered request (RouterMetrics.answered)
        self.activity = activity
        self.index = index
        self.processes = processes
        self.file_of = file_of
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        seen, rendered_at = None, 0.0
        while True:
            now = time.monotonic()
            count = self.activity()
            path = self.file_of(self.index)
            try:
                if count == seen and now - rendered_at < REFRESH_S and path.exists():
                    os.utime(path)  # nothing answered since: the file is current, keep it fresh
                else:
                    write_exposition(path, self.render())
                    seen, rendered_at = count, now
                if self.counters is not None:
                    self._write_counters(counters_file(path))
            except OSError as exc:
                log.warning("cannot write this process's metrics for the others", extra={"error": str(exc)})
            await asyncio.sleep(WRITE_S)

    def _write_counters(self, path: Path) -> None:
        assert self.counters is not None
        text = json.dumps(self.counters(), sort_keys=True)
        if text == self._counters_written and path.exists():
            os.utime(path)  # unchanged: fresh for the leader's staleness test
        else:
            write_exposition(path, text.encode())
            self._counters_written = text

    def peer_counters(self) -> list[dict[str, Any]]:
        """The other processes' counters, from their files (one older than STALE_S, or unreadable, is
        left out: a dead process's, or one being started again)."""
        out: list[dict[str, Any]] = []
        now = time.time()
        for i in range(self.processes):
            if i == self.index:
                continue
            path = counters_file(self.file_of(i))
            try:
                if not _fresh(path, now):
                    continue
                with path.open("rb") as f:
                    data = f.read(MAX_COUNTERS_BYTES + 1)
                if len(data) > MAX_COUNTERS_BYTES:
                    continue
                doc = json.loads(data)
            except (OSError, ValueError, RecursionError):  # RecursionError: nested past the parser's depth
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    def scrape(self) -> bytes:
        texts = [(self.index, self.render().decode())]
        now = time.time()
        for i in range(self.processes):
            if i == self.index:
                continue
            path = self.file_of(i)
            try:
                if not _fresh(path, now):
                    continue
                texts.append((i, path.read_text()))
            except OSError:
                continue
        return merge(sorted(texts), self.index)
