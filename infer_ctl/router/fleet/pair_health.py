"""The router's side of pair health (the pure state is core/routing/pair_health.py): what it learns about
each prefill x decode pair and the picker's filter.

Where the live KV numbers come from, in SGLang 0.5.23: `kv_transfer_speed_gb_s` and
`kv_transfer_latency_ms` in `/v1/loads` (`disaggregation`, managers/load_snapshot.py) are set on the
*prefill* only, from its last finished transfer (disaggregation/prefill.py sets
metrics_reporter.kv_transfer_speed_gb_s/_latency_ms per done request; metrics_reporter.py copies them
into the stats in PREFILL mode only; a decode reports 0.0), and carry no decode. So a prefill's value at
a health poll that follows at least one request the router completed through it since the previous poll
is attributed to the decode of the last of them: exact when the poll interval saw one transfer, and under
concurrent traffic still the most recent pair, which a bad_samples run needs several times in a row. (A
poll with no completed request says nothing new: the value is the old transfer's.) A failed transfer is seen
directly: a decode that answers an error naming the KV transfer or the bootstrap (SGLang's "KV transfer
failed for bootstrap_room=...", "... timed out ... KVPoll.Bootstrapping"), or a prefill whose request
failed with such an error, fails the attempt on that pair;
SGLang counts the same in `sglang:num_transfer_failed_reqs_total` (metrics_collector.py) without a pair.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from infer_ctl.core.routing.pair_health import PairFloor, PairHealth
from infer_ctl.router.fleet.workers import WorkerState

_TRANSFER = re.compile(r"kv transfer|bootstrap|kvpoll|transfer failed", re.IGNORECASE)
#: either side may report a failed transfer first (the prefill's request fails with it, and the router
#: ends the attempt on whichever answers first: router/request/attempt.py)
_PAIR_CAUSES = frozenset({"decode_status", "decode_error", "stream_status", "prefill_status", "prefill_error"})


def kv_numbers(doc: Any) -> tuple[float | None, float | None]:
    """(speed GB/s, latency ms) of a /v1/loads answer: the slowest rank's, None where no rank reported a
    transfer yet (SGLang's 0.0 default)."""
    ranks = doc.get("loads") if isinstance(doc, dict) else doc
    if isinstance(ranks, dict):
        ranks = [ranks]
    speeds, lats = [], []
    for r in ranks if isinstance(ranks, list) else []:
        d = r.get("disaggregation") if isinstance(r, dict) else None
        if not isinstance(d, dict):
            continue
        s, lat = d.get("kv_transfer_speed_gb_s"), d.get("kv_transfer_latency_ms")
        if isinstance(s, int | float) and not isinstance(s, bool) and s > 0:
            speeds.append(float(s))
        if isinstance(lat, int | float) and not isinstance(lat, bool) and lat > 0:
            lats.append(float(lat))
    return (min(speeds) if speeds else None), (max(lats) if lats else None)


class PairTracker:
    def __init__(self, floor: PairFloor, clock: Callable[[], float]) -> None:
        self.health = PairHealth(floor)
        self.clock = clock
        #: prefill url -> decode url of the last request completed through it
        self.last_decode: dict[str, str] = {}
        #: prefill url -> requests completed through it since its last /v1/loads poll
        self.completed: dict[str, int] = {}
        #: how often the filter steered a request away from a degraded pair / found no healthy pair
        self.avoided = 0
        self.fallbacks = 0

    @property
    def active(self) -> bool:
        return bool(self.health.pairs) and bool(self.health.degraded())

    # ---- the picker ------------------------------------------------------------------------------
    def prefills(self, prefills: list[WorkerState], decodes: Sequence[WorkerState], now: float) -> list[WorkerState]:
        """Prefills that can take the request and have at least one pair not to avoid with a decode that
        can (all of them when none has). A pair whose prefill or decode is out serves nothing: preferring
        it refused the request while a degraded pair could serve it, and avoiding is never refusing."""
        if not self.active:
            return prefills
        avoid = self.health.avoid
        up = [d for d in decodes if d.available(now)] or decodes
        avail = [p for p in prefills if p.available(now)]
        ok = [p for p in avail if any(not avoid(p.url, d.url, now) for d in up)]
        if ok and len(ok) < len(avail):
            self.avoided += 1
        return ok or prefills

    def decodes(self, prefill: str, decodes: list[WorkerState], now: float) -> list[WorkerState]:
        """The decodes for `prefill` that can take the request on a pair not to avoid; all of them when
        none can (a fallback to a degraded pair when one of them can take it)."""
        if not self.active:
            return decodes
        avail = [d for d in decodes if d.available(now)]
        ok = [d for d in avail if not self.health.avoid(prefill, d.url, now)]
        if not ok:
            if avail:
                self.fallbacks += 1
            return decodes
        if len(ok) < len(avail):
            self.avoided += 1
        return ok

    def chosen(self, prefill: str, decode: str, now: float) -> None:
        self.health.probe(prefill, decode, now)

    # ---- what the router learns --------------------------------------------------------------------
    def outcome(self, pre: WorkerState, dec: WorkerState | None, failure: Any | None) -> None:
        """An attempt ended (`failure`: its retry.AttemptFailed, None on success)."""
        if dec is None:
            return
        now = self.clock()
        if failure is None:
            self.last_decode[pre.url] = dec.url
            self.completed[pre.url] = self.completed.get(pre.url, 0) + 1
            self.health.outcome(pre.url, dec.url, ok=True, transfer_failed=False, now=now)
            return
        text = f"{failure.message} {failure.body[:2000].decode('utf-8', 'replace') if failure.body else ''}"
        transfer = failure.cause in _PAIR_CAUSES and bool(_TRANSFER.search(text))
        self.health.outcome(pre.url, dec.url, ok=False, transfer_failed=transfer, now=now)

    def kv_poll(self, prefill: WorkerState, doc: Any) -> None:
        """A prefill's /v1/loads after requests completed through it: the last transfer of its last pair."""
        if prefill.role != "prefill" or not self.completed.get(prefill.url):
            return
        kv = kv_numbers(doc)
        dec = self.last_decode.get(prefill.url)
        if kv == (None, None) or dec is None:
            return
        self.completed[prefill.url] = 0
        self.health.sample(prefill.url, dec, kv[0], kv[1], self.clock())

    def restarted(self, url: str) -> None:
        """The worker's process is new (health.py saw another instance): its pairs start again."""
        self.health.restarted(url)
        self.completed.pop(url, None)

    def forget(self, url: str) -> None:
        self.health.forget(url)
        self.last_decode.pop(url, None)
        self.completed.pop(url, None)
        for p in [p for p, d in self.last_decode.items() if d == url]:
            del self.last_decode[p]
