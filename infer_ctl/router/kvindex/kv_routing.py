"""The exact index as the router uses it: discovery, the streams, the anchors, and per-request lookups.

Discovery: health.py hands every worker's `/server_info` to `configure`, which subscribes to what it
describes (router/kvindex/kv_discovery.py). The first prefill's `/server_info` also chooses how prompts
are tokenized (router/kvindex/kv_prompts.py).

Request path (`cached`): per exact worker, the prompt units it holds (core/routing/anchors.py): a few
dict lookups and a binary search per worker on the block chain the predicted index computed already.
Workers whose stream is not exact get None and are scored on the predicted index. With HiCache, a
prompt's chain continued in a worker's host tier counts at the tier's weight (`tier_weights`,
core/routing/tiers.py: computed once from the router's configuration), so an HBM hit beats a host
hit, which beats a cold worker of equal load. After the decision
(`routed`), the prompt is queued for anchoring, which runs in a background task, newest first when it
falls behind (a prompt the queue drops is anchored the next time it comes).

First sight (`lookup`): a prompt no request through this router anchored deeply enough is anchored on
the request path, within a time budget. Its prefix may have reached a worker past this router (another
replica or router process, another frontend, a direct call), and the lookup after it finds that; else
it is new to the fleet and this cost a few ms once.

Anchoring (the tables, the background task, the first sight's build) is router/kvindex/kv_anchoring.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from infer_ctl.core.routing.anchors import AnchorTable, full_key
from infer_ctl.core.routing.index import BLOCK_CHARS
from infer_ctl.core.routing.tiers import TierWeights
from infer_ctl.core.routing.units import CHARS_PER_TOKEN
from infer_ctl.router.kvindex.kv_anchoring import HOLD_CHARS, Anchoring, prompt_kind
from infer_ctl.router.kvindex.kv_discovery import WorkerKv, decode_radix_cache, subscription
from infer_ctl.router.kvindex.kv_prompts import PromptView
from infer_ctl.router.kvindex.kv_subscriber import KvStream, StreamSettings

log = logging.getLogger("infer_ctl.router.kv")

_ONE = TierWeights().of  # every tier at 1: the unweighted cached length


class KvRouting:
    def __init__(self, *, enabled: bool, settings: StreamSettings, tier_weights: TierWeights | None,
                 anchor_max_chars: int, tokenizer_path: str | None, block_chars: int = BLOCK_CHARS,
                 max_anchors: int = 500_000, metrics: Any = None,
                 chars_per_token: Callable[[], float] | None = None, processes: int = 1) -> None:
        """`enabled`, `settings`, `tier_weights`, `anchor_max_chars` and `tokenizer_path` come from the
        router's settings (router/config.py `kv_routing` builds this): no default here. `chars_per_token`: the router's
        learned ratio (None: core/routing/units.py's CHARS_PER_TOKEN)."""
        self.enabled = enabled
        #: what a cached token on a lower tier counts (None: only HBM counts, host pages are ignored)
        self.tier_weights = tier_weights
        self._weight = tier_weights.of if tier_weights is not None else None
        self.block_chars = block_chars
        self.tokenizer_path = tokenizer_path
        self.settings = settings
        self.max_anchors = max_anchors
        self.metrics = metrics
        self.workers: dict[str, WorkerKv] = {}
        #: decodes not subscribed, and why (no radix cache): `router workers` says so
        self.skipped: dict[str, str] = {}
        self.anchoring = Anchoring(block_chars=block_chars, max_anchors=max_anchors, anchor_max_chars=anchor_max_chars,
                                   spaces=lambda: {w.space() for w in self.workers.values()})
        #: the router's chars-per-token estimate (feedback.py): predicted matches in tokens
        self.chars_per_token: Callable[[], float] = chars_per_token or (lambda: CHARS_PER_TOKEN)
        #: what one request already on a prefill costs a new one, in prompt units: the mean uncached
        #: prompt tokens of recent answers (None until the first answer: the policy uses the prompt)
        self.queue_cost: float | None = None
        #: router processes on this address (router/daemon/procs.py): a prefill that stops publishing is worth a warning
        self.processes = processes
        #: called with the worker's URL after each applied batch (router/request/coalesce.py), bound by the
        #: router's assembly (router/daemon/assembly.py: the coalescer holds this index); None: nobody listens
        self.on_batch: Callable[[str], None] | None = None

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self.anchoring.start()

    async def stop(self) -> None:
        for w in self.workers.values():
            for s in w.streams:
                await s.stop()
        await self.anchoring.stop()

    # ---- the anchoring's, as the request path and the admin API read them (kv_anchoring.py) ----------
    @property
    def view(self) -> PromptView | None:
        """How prompts are tokenized for anchoring (None: no tokenizer, the predicted index only)."""
        return self.anchoring.view

    @view.setter
    def view(self, view: PromptView | None) -> None:
        self.anchoring.view = view

    @property
    def view_reason(self) -> str:
        return self.anchoring.view_reason

    @property
    def tables(self) -> dict[tuple[int, bool, str], AnchorTable]:
        return self.anchoring.tables

    @property
    def first_sight_budget(self) -> float:
        return self.anchoring.first_sight_budget

    @first_sight_budget.setter
    def first_sight_budget(self, budget: float) -> None:
        self.anchoring.first_sight_budget = budget

    @property
    def first_sight(self) -> dict[str, float]:
        return self.anchoring.first_sight_counts

    @property
    def anchor_skipped(self) -> dict[str, int]:
        return self.anchoring.skipped

    @property
    def active(self) -> bool:
        return any(w.exact for w in self.workers.values()) and self.view is not None

    # ---- discovery (health checks) ------------------------------------------------------------------
    def configure(self, url: str, info: Any, role: str = "prefill") -> None:
        """A worker's /server_info: (re)subscribe when it advertises KV events (a decode: only when it
        runs a radix cache, `decode_radix_cache`)."""
        if not self.enabled or not isinstance(info, dict):
            return
        if role == "decode":
            why = decode_radix_cache(info)
            if why is not None:
                self.forget(url)
                self.skipped[url] = why
                return
            self.skipped.pop(url, None)
        self.anchoring.choose_view(info, self.tokenizer_path, url)
        sub = subscription(url, info)
        if sub is None:
            if (url in self.workers and self.processes > 1 and role != "decode"
                    and not isinstance(info.get("kv_events"), dict)):
                # the start-up check (router/daemon/procs.py) chose several processes because it published
                log.warning("KV events: the worker publishes no more KV events; each of the router's "
                            f"{self.processes} processes now routes it on its own predicted index, and "
                            "their predictions differ", extra={"worker": url, "remedy": (
                                "relaunch the worker with --kv-events-config, or restart the router "
                                "(it then runs one process)")})
            self.forget(url)
            return
        cur = self.workers.get(url)
        if cur is not None and cur.descriptor == sub.key:
            return
        self.forget(url)
        streams = [KvStream(url, pub, rep, sub.topic, settings=self.settings, on_event=self._on_event, rank=r)
                   for r, (pub, rep) in enumerate(sub.endpoints)]
        self.workers[url] = WorkerKv(url, streams, sub.page_size, sub.bigram, sub.key)
        for s in streams:
            s.start()
        log.warning("KV events: subscribed", extra={"worker": url, "endpoints": [e[0] for e in sub.endpoints],
                                                    "page_size": sub.page_size, "bigram": sub.bigram})

    def forget(self, url: str) -> None:
        self.skipped.pop(url, None)
        w = self.workers.pop(url, None)
        if w is not None:
            for s in w.streams:
                s.cancel()

    def restarted(self, url: str) -> None:
        w = self.workers.get(url)
        if w is not None:
            for s in w.streams:
                s.restarted()

    def down(self, url: str) -> None:
        w = self.workers.get(url)
        if w is not None:
            for s in w.streams:
                s.down()

    def up(self, url: str) -> None:
        w = self.workers.get(url)
        if w is not None:
            for s in w.streams:
                s.up()

    def _on_event(self, stream: KvStream, what: str, n: int) -> None:
        if what == "batches" and (w := self.workers.get(stream.worker)) is not None:
            w.keyed_as_stored(stream)
        if what == "batches" and self.on_batch is not None:
            self.on_batch(stream.worker)  # in-flight coalescing: a held request's leader may have landed
        if self.metrics is not None:
            self.metrics.kv_event(stream.worker, what, n)

    # ---- the request path ---------------------------------------------------------------------------
    def table(self, space: tuple[int, bool], kind: str) -> AnchorTable:
        return self.anchoring.table(space, kind)

    kind = staticmethod(prompt_kind)

    def keys(self, kind: str, body: dict[str, Any], hashes: Sequence[int]) -> Sequence[int]:
        return self.anchoring.keys(kind, body, hashes)

    def lookup(self, endpoint: str, body: dict[str, Any], text: str, hashes: Sequence[int], urls: Sequence[str],
               threshold: float) -> tuple[dict[str, int], int]:
        """The request path's one pass (picker.py `_exact`): first sight, then `cached` (tier-weighted),
        sharing the prompt's kind, keys and anchor depths (the check and the lookup read the same
        anchors). First sight (module docstring): a prompt some exact worker's anchors cover
        under `threshold` of, while some exact worker holds blocks at all, is anchored now, within
        `first_sight_budget` of this process's time; a long one only off the loop (HOLD_CHARS)."""
        fk = full_key(hashes, text, self.block_chars)
        if self.view is None:
            return {}, fk
        kind = prompt_kind(endpoint, body)
        keys = self.keys(kind, body, hashes)
        depths: dict[tuple[int, bool], int] = {}
        if self.first_sight_budget > 0 and len(hashes) >= 2 and len(text) <= HOLD_CHARS:
            exact = [w for w in self.workers.values() if w.exact]
            if any(s.blocks.device for w in exact for s in w.streams):  # else nothing is cached anywhere: unseen
                self.anchoring.first_sight(endpoint, body, text, hashes, fk, kind, keys, [w.space() for w in exact],
                                           threshold, depths)
        return self._units(keys, fk, urls, kind, self._weight, depths), fk

    def cached(self, hashes: Sequence[int], text: str, urls: Sequence[str], kind: str = "text",
               body: dict[str, Any] | None = None, weighted: bool = True) -> tuple[dict[str, int], int]:
        """Exact cached prompt units per worker in `urls` whose stream is exact, tier-weighted (what
        the policy scores), and the full-prompt key. `weighted=False`: every tier the router counts
        at 1, as a worker reports cached tokens (the accounting's number)."""
        fk = full_key(hashes, text, self.block_chars)
        if self.view is None:
            return {}, fk
        weight = self._weight if weighted or self._weight is None else _ONE
        return self._units(self.keys(kind, body or {}, hashes), fk, urls, kind, weight, {}), fk

    def _units(self, keys: Sequence[int], fk: int, urls: Sequence[str], kind: str,
               weight: Callable[[str], float] | None, depths: dict[tuple[int, bool], int]) -> dict[str, int]:
        """`cached`'s numbers; `depths`: the anchor depth of `keys` per key space, where known already."""
        out: dict[str, int] = {}
        tables = self.tables
        for url in urls:
            w = self.workers.get(url)
            if w is None or not w.exact:
                continue
            space = (w.page_size, w.bigram)
            t = tables.get((*space, kind))
            if t is None:
                out[url] = 0
                continue
            d = depths.get(space)
            if d is None:
                d = depths[space] = t.depth(keys)
            best = 0
            for s in w.streams:
                best = max(best, t.cached_units(keys, fk, d, s.blocks, weight))
            out[url] = best
        return out

    def residency(self, hashes: Sequence[int], text: str, url: str, kind: str = "text",
                  body: dict[str, Any] | None = None, share: float = 0.9) -> str | None:
        """Where a worker holds a whole prompt (a named prefix: `keep`, core/routing/prefixes.py): hbm
        (90 % of it in HBM, or `share` of it), host (that counting the lower tiers), none; None when the
        router cannot tell (the worker's stream is not exact, or the prompt was never anchored)."""
        w = self.workers.get(url)
        if self.view is None or w is None or not w.exact:
            return None
        fk = full_key(hashes, text, self.block_chars)
        t = self.tables.get((*w.space(), kind))
        units = t.prompt_tokens(fk) if t is not None else None
        if t is None or not units:
            return None
        keys = self.keys(kind, body or {}, hashes)
        d = t.depth(keys)
        need = share * max(1, units - w.page_size)  # SGLang matches n - 1 tokens, in whole pages
        if max(t.cached_units(keys, fk, d, s.blocks) for s in w.streams) >= need:
            return "hbm"
        return "host" if max(t.cached_units(keys, fk, d, s.blocks, _ONE) for s in w.streams) >= need else "none"

    def marks(self, url: str) -> tuple[int, int]:
        """How often the router's view of a worker's cache was started again (its streams' cleared
        batches and restarts) and how many blocks its stores brought: what changed since another call
        (router/request/coalesce.py: whether a landed prompt's stores, or a clear, came in since it landed)."""
        w = self.workers.get(url)
        if w is None:
            return -1, 0
        return (sum(s.stats.cleared + s.stats.restarts for s in w.streams), sum(s.stats.stored for s in w.streams))

    def prompt_units(self, fk: int, urls: Sequence[str], kind: str = "text") -> int | None:
        for url in urls:
            w = self.workers.get(url)
            if w is not None:
                t = self.tables.get((*w.space(), kind))
                if t is not None:
                    n = t.prompt_tokens(fk)
                    if n is not None:
                        return n
        return None

    def routed(self, endpoint: str, body: dict[str, Any], text: str, hashes: list[int], fk: int,
               answered: bool = False) -> None:
        """After a routing decision: anchor this prompt off the request path (once per new text).
        `answered`: the worker already accepted it (a named prefix's warm-up), so a long one is not held."""
        if self.view is None or not text or not self.workers:
            return
        self.anchoring.routed(endpoint, body, text, hashes, fk, answered)

    def below_device(self, url: str) -> bool:
        """Whether a worker's streams hold any block below the device (host memory, storage): only then
        can its tier-weighted `cached` number differ from the unweighted one."""
        w = self.workers.get(url)
        return w is not None and any(b for s in w.streams for b in s.blocks.other.values())

    def footprint_chars(self, url: str, cpt: float) -> int:
        """Cached size of a worker in routing-text characters (the fallback compares workers by it)."""
        w = self.workers.get(url)
        if w is None:
            return 0
        return int(max((len(s.blocks.device) for s in w.streams), default=0) * w.page_size * cpt)

    def account(self, url: str, *, exact: int | None, predicted: int, prompt_tokens: int | None,
                reported: int | None, full_key: int | None = None) -> None:
        """One answer from a prefill: the accounting `router workers` shows, and the queue cost; a long
        prompt held for its answer (`routed`) is anchored now."""
        if full_key is not None:
            self.anchoring.answered(full_key)
        if prompt_tokens and reported is not None:
            uncached = max(0, prompt_tokens - reported)
            self.queue_cost = uncached if self.queue_cost is None else 0.9 * self.queue_cost + 0.1 * uncached
        w = self.workers.get(url)
        if w is None:
            return
        w.requests += 1
        w.exact_tokens += exact or 0
        w.predicted_tokens += predicted
        w.reported_tokens += reported or 0

    # ---- views (and worker_doc below) ------------------------------------------------------------------
    def status_doc(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "tokenizer": self.view.name if self.view else None,
                "tokenizer_reason": self.view_reason,
                "workers": {u: w.state for u, w in self.workers.items()},
                **self.anchoring.status()}


def worker_doc(kv: KvRouting, url: str, role: str = "prefill") -> dict[str, Any]:
    """A worker's index for `router workers`. A decode has no predicted index: its `index` is its
    streams' state (exact, replaying, untrusted, down), or absent when it is not subscribed."""
    w = kv.workers.get(url)
    decode = role == "decode"
    if w is None:
        why = kv.skipped.get(url) or ("no KV events" if kv.enabled else "KV events off")
        return {"index_reason": why} if decode else {"index": "predicted", "index_reason": why}
    if kv.view is None and not decode:
        return {"index": "predicted", "index_reason": kv.view_reason}
    return w.doc(decode)
