"""The exact index as the router uses it: discovery, the streams, the anchors, and per-request lookups.

Discovery (health.py hands every worker's `/server_info` to `configure`; a decode counts only when it
keeps a radix cache, `decode_radix_cache`): `kv_events` (SGLang 0.5.23's
`describe_kv_events_publisher`: endpoint host and port base, replay port base, topic, block size,
dp_size; dialed at the worker URL's host, DP rank r at base + r: `endpoints`),
`page_size`, and `speculative_algorithm` (an EAGLE worker keys its radix tree by bigrams, which its
stores also show). The first prefill's `/server_info` also chooses how prompts are tokenized
(router/kvindex/kv_prompts.py).

Request path (`cached`): per exact worker, the prompt units it holds (core/routing/anchors.py): a few
dict lookups and a binary search per worker on the block chain the predicted index computed already.
Workers whose stream is not exact get None and are scored on the predicted index. With HiCache, a
prompt's chain continued in a worker's host tier counts at the tier's weight (`tier_weights`,
core/routing/tiers.py: computed once from the router's configuration), so an HBM hit beats a host
hit, which beats a cold worker of equal load. After the decision
(`routed`), the prompt is queued for anchoring, which runs in a background task, newest first when it
falls behind (a prompt the queue drops is anchored the next time it comes).

Anchoring tokenizes the whole prompt: 2 s for a 1 MB prompt, 16 s for 29 MB (under the 32 MiB body
limit), a one-request denial of service when it ran on the event loop (issue 28). So it runs on one
worker thread (the tokenizer releases the GIL: kv_prompts.py; the rest yields every switch interval),
one prompt at a time under `_lock` (the request path's first-sight anchoring takes it only when free);
the loop's readers only look up single dict entries, each atomic. A prompt over `anchor_max_chars` is
not anchored (routed on the predicted index; counted), and one over `_HOLD_CHARS` waits for its
worker's answer (`account`): a prompt the worker rejected (over its context, malformed) is never
tokenized. Smaller ones are anchored at once, as cheap as the lookups (and the next request with their
prefix wants them before the answer).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infer_ctl.core.routing.anchors import AnchorTable, full_key
from infer_ctl.core.routing.index import BLOCK_CHARS
from infer_ctl.core.routing.tiers import TierWeights
from infer_ctl.router.kvindex.kv_prompts import ChatKeys, PromptView, chat_layout, view_for
from infer_ctl.router.kvindex.kv_subscriber import KvStream, StreamSettings

log = logging.getLogger("infer_ctl.router.kv")

#: SGLang 0.5.23's `SpeculativeAlgorithm.is_eagle()` (speculative/spec_info.py): EAGLE, EAGLE3 and
#: FROZEN_KV_MTP (what a Gemma4 assistant draft's EAGLE/NEXTN becomes, arg_groups/speculative_hook.py);
#: its radix cache keys pages by bigrams (RadixKey.maybe_to_bigram_view). NEXTN is EAGLE's alias.
_BIGRAM_ALGOS = frozenset({"EAGLE", "EAGLE3", "FROZEN_KV_MTP", "NEXTN"})
_ONE = TierWeights().of  # every tier at 1: the unweighted cached length
#: prompts longer than this (characters) are anchored only once their worker answered (module docstring)
_HOLD_CHARS = 32 << 10
#: prompts held for an answer at most: the oldest is forgotten (a request that never got one)
_HOLD_MAX = 256


def bigram_keys(info: dict[str, Any]) -> bool:
    """Whether a worker's /server_info says its radix cache keys pages by bigrams (SGLang upper-cases
    the name it is given: `SpeculativeAlgorithm.from_string`)."""
    algo = info.get("speculative_algorithm")
    return isinstance(algo, str) and algo.upper() in _BIGRAM_ALGOS


@dataclass
class WorkerKv:
    url: str
    streams: list[KvStream]
    page_size: int
    bigram: bool
    #: descriptor that made the streams (a change re-subscribes)
    descriptor: tuple[Any, ...]
    #: per-request accounting for `router workers`: exact and predicted cached tokens of the
    #: requests routed here, and what the worker reported
    requests: int = 0
    exact_tokens: int = 0
    predicted_tokens: int = 0
    reported_tokens: int = 0

    @property
    def state(self) -> str:
        states = {s.state for s in self.streams}
        for s in ("down", "untrusted", "replaying"):
            if s in states:
                return s
        return "exact"

    @property
    def exact(self) -> bool:
        return all(s.state == "exact" for s in self.streams)

    def space(self) -> tuple[int, bool]:
        return self.page_size, self.bigram


def decode_radix_cache(info: dict[str, Any]) -> str | None:
    """None when a decode's /server_info says it keeps a radix cache, else why not.

    SGLang 0.5.23 forces `disable_radix_cache=True` on a decode unless it runs with
    `--disaggregation-decode-enable-radix-cache` (python/sglang/srt/arg_groups/pd_disaggregation_hook.py);
    a decode without a radix cache stores nothing, yet still advertises `kv_events` when given
    --kv-events-config (runtime_context.py `describe_kv_events_publisher` looks only at that config), so
    its empty stream would read "exact, 0 blocks" forever."""
    if info.get("disaggregation_decode_enable_radix_cache") is not True:
        return "decode without a radix cache (SGLang: --disaggregation-decode-enable-radix-cache is off)"
    if info.get("disable_radix_cache") is True:
        return "decode with --disable-radix-cache"
    return None


def _host(url: str) -> str:
    host = urlsplit(url).hostname or "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _port_base(v: Any, dp: int) -> int | None:
    """A port base whose dp ranks all are ports (base + r for rank r)."""
    ok = isinstance(v, int) and not isinstance(v, bool) and v > 0 and v + dp - 1 <= 65535
    return v if ok else None


def endpoints(url: str, desc: dict[str, Any]) -> list[tuple[str, str | None]] | None:
    """(PUB endpoint, replay endpoint) per DP rank of a worker's `/server_info.kv_events`.

    Dialed at the worker URL's host whatever `endpoint_host` says: a wildcard means that host anyway,
    and a named one would have the router connect wherever a worker's /server_info points (another
    host, a metadata address, a string that is no host or has a scheme in it: review of issue 19). A
    publisher bound to one address of the worker's host is reached when the URL names that address."""
    dp = desc.get("dp_size") or 1
    dp = dp if isinstance(dp, int) and not isinstance(dp, bool) and 1 <= dp <= 256 else 1
    port = _port_base(desc.get("endpoint_port_base"), dp)
    if port is None:
        return None
    host = _host(url)
    replay = _port_base(desc.get("replay_endpoint_port_base"), dp)
    if replay is not None and abs(replay - port) < dp:
        replay = None  # the same ports as the PUB sockets: no replay socket there
    return [(f"tcp://{host}:{port + r}", f"tcp://{host}:{replay + r}" if replay else None) for r in range(dp)]


class KvRouting:
    def __init__(self, *, enabled: bool = True, block_chars: int = BLOCK_CHARS, tokenizer_path: str | None = None,
                 settings: StreamSettings | None = None, max_anchors: int = 500_000, metrics: Any = None,
                 tier_weights: TierWeights | None = None, anchor_max_chars: int = 256 << 10) -> None:
        self.enabled = enabled
        #: the longest prompt (characters of routing text) anchored; longer ones are routed on the
        #: predicted index (`anchor_skipped["too_long"]`)
        self.anchor_max_chars = anchor_max_chars
        self.anchor_skipped = {"too_long": 0, "unanswered": 0}
        self._held: OrderedDict[int, tuple[str, dict[str, Any], str, list[int], int]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        #: what a cached token on a lower tier counts (None: only HBM counts, host pages are ignored)
        self.tier_weights = tier_weights
        self._weight = tier_weights.of if tier_weights is not None else None
        self.block_chars = block_chars
        self.tokenizer_path = tokenizer_path
        self.settings = settings or StreamSettings()
        self.max_anchors = max_anchors
        self.metrics = metrics
        self.workers: dict[str, WorkerKv] = {}
        #: decodes not subscribed, and why (no radix cache): `router workers` says so
        self.skipped: dict[str, str] = {}
        self.tables: dict[tuple[int, bool, str], AnchorTable] = {}
        self.view: PromptView | None = None
        self.view_reason = "no prefill reported its tokenizer yet"
        #: the reasons for no tokenizer already logged (`configure`)
        self._view_logged: set[str] = set()
        self._queue: deque[tuple[str, dict[str, Any], str, list[int], int]] = deque(maxlen=512)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.build_seconds = 0.0
        #: the router's chars-per-token estimate (feedback.py): predicted matches in tokens
        self.chars_per_token: Any = lambda: 4.0
        #: what one request already on a prefill costs a new one, in prompt units: the mean uncached
        #: prompt tokens of recent answers (None until the first answer: the policy uses the prompt)
        self.queue_cost: float | None = None
        #: seconds per second this process may spend anchoring, on the request path, prompts it has not
        #: anchored deeply enough while the workers hold blocks (another replica's, process's or
        #: frontend's traffic may have cached them: `anchor_first_sight`); 0: off, every prompt is
        #: anchored after its first routing only (router/scaleout/state_sync.py sets the replicas' budget)
        self.first_sight_budget = 0.05
        self._budget = 0.0
        self._budget_at = time.monotonic()
        self.first_sight = {"anchored": 0, "over_budget": 0, "seconds": 0.0}
        #: router processes on this address (router/daemon/procs.py): a prefill that stops publishing is worth a warning
        self.processes = 1
        #: called with the worker's URL after each applied batch (router/request/coalesce.py); None: nobody listens
        self.on_batch: Any = None

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._builder())

    async def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        tasks = [self._task] if self._task else []
        for w in self.workers.values():
            for s in w.streams:
                await s.stop()
        for t in tasks:
            t.cancel()
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass

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
        if self.view is None:
            self.view, self.view_reason = view_for(info, self.tokenizer_path)
            if self.view is not None:
                log.info("KV events: prompts tokenized with " + self.view_reason, extra={"worker": url})
            elif self.view_reason not in self._view_logged:
                # once per cause: every health check configures every worker again (a warning each 5 s)
                self._view_logged.add(self.view_reason)
                log.warning("KV events: no tokenizer, every worker routed on the predicted index: " + self.view_reason,
                            extra={"worker": url})
        desc = info.get("kv_events")
        if not isinstance(desc, dict):
            if url in self.workers and self.processes > 1 and role != "decode":
                # the start-up check (router/daemon/procs.py) chose several processes because it published
                log.warning("KV events: the worker publishes no more KV events; each of the router's "
                            f"{self.processes} processes now routes it on its own predicted index, and "
                            "their predictions differ", extra={"worker": url, "remedy": (
                                "relaunch the worker with --kv-events-config, or restart the router "
                                "(it then runs one process)")})
            self.forget(url)
            return
        eps = endpoints(url, desc)
        if not eps:
            self.forget(url)
            return
        page = desc.get("block_size") or info.get("page_size") or 1
        page = page if isinstance(page, int) and page >= 1 else 1
        bigram = bigram_keys(info)
        topic = desc.get("topic")
        topic = topic if isinstance(topic, str) else ""
        key = (tuple(eps), topic, page, bigram)
        cur = self.workers.get(url)
        if cur is not None and cur.descriptor == key:
            return
        self.forget(url)
        streams = [KvStream(url, pub, rep, topic, settings=self.settings, on_event=self._on_event, rank=r)
                   for r, (pub, rep) in enumerate(eps)]
        self.workers[url] = WorkerKv(url, streams, page, bigram, key)
        for s in streams:
            s.start()
        log.warning("KV events: subscribed", extra={"worker": url, "endpoints": [e[0] for e in eps],
                                                    "page_size": page, "bigram": bigram})

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
        w = self.workers.get(stream.worker)
        # the stores are the truth about the keying: /server_info only guessed it
        if (w is not None and what == "batches" and stream.block_size and stream.bigram is not None
                and (stream.block_size, stream.bigram) != w.space()):
            log.warning("KV events: the worker's stores disagree with /server_info about its pages",
                        extra={"worker": w.url, "page_size": stream.block_size, "bigram": stream.bigram})
            w.page_size, w.bigram = stream.block_size, stream.bigram
        if what == "batches" and self.on_batch is not None:
            self.on_batch(stream.worker)  # in-flight coalescing: a held request's leader may have landed
        if self.metrics is not None:
            self.metrics.kv_event(stream.worker, what, n)

    # ---- the request path ---------------------------------------------------------------------------
    def table(self, space: tuple[int, bool], kind: str) -> AnchorTable:
        t = self.tables.get((*space, kind))
        if t is None:
            t = self.tables[(*space, kind)] = AnchorTable(space[0], bigram=space[1], block_chars=self.block_chars,
                                                          max_anchors=self.max_anchors)
        return t

    @staticmethod
    def kind(endpoint: str, body: dict[str, Any]) -> str:
        """Which anchors a prompt uses: a chat's routing text can start like a plain prompt's while the
        worker sees its template around it, so each kind has its own (chat, ids, text)."""
        if endpoint.endswith("/chat/completions"):
            return "chat"
        if not endpoint.endswith("/completions") and body.get("text") is None and body.get("input_ids") is not None:
            return "ids"
        return "text"

    def keys(self, kind: str, body: dict[str, Any], hashes: Sequence[int]) -> Sequence[int]:
        """The anchor keys of a prompt's blocks: the block chain, keyed with the roles for a chat."""
        if kind != "chat":
            return hashes
        msgs = body.get("messages")
        starts, _, _, roles = chat_layout(msgs if isinstance(msgs, list) else [])
        return ChatKeys(hashes, starts, roles, self.block_chars)

    def cached(self, hashes: Sequence[int], text: str, urls: Sequence[str], kind: str = "text",
               body: dict[str, Any] | None = None, weighted: bool = True) -> tuple[dict[str, int], int]:
        """Exact cached prompt units per worker in `urls` whose stream is exact, tier-weighted (what
        the policy scores), and the full-prompt key. `weighted=False`: every tier the router counts
        at 1, as a worker reports cached tokens (the accounting's number)."""
        fk = full_key(hashes, text, self.block_chars)
        weight = self._weight if weighted or self._weight is None else _ONE
        hashes = self.keys(kind, body or {}, hashes)
        out: dict[str, int] = {}
        if self.view is None:
            return out, fk
        depths: dict[tuple[int, bool], int] = {}
        for url in urls:
            w = self.workers.get(url)
            if w is None or not w.exact:
                continue
            space = (w.page_size, w.bigram)
            t = self.tables.get((*space, kind))
            if t is None:
                out[url] = 0
                continue
            d = depths.get(space)
            if d is None:
                d = depths[space] = t.depth(hashes)
            best = 0
            for s in w.streams:
                best = max(best, t.cached_units(hashes, fk, d, s.blocks, weight))
            out[url] = best
        return out, fk

    def anchor_first_sight(self, endpoint: str, body: dict[str, Any], text: str, hashes: Sequence[int],
                           threshold: float) -> bool:
        """Anchor on the request path a prompt whose anchors cover under `threshold` of its blocks (no
        worker could qualify as its holder on them) when some exact worker holds blocks at all, within
        `first_sight_budget` of this process's time. Its prefix may have reached a worker past this
        router: through another replica or router process ("Several replicas", "Several processes"),
        another frontend, or a direct call; the lookup after this finds it. Otherwise it is new to the
        fleet and this cost a few ms once. Returns whether it anchored."""
        if self.first_sight_budget <= 0 or self.view is None or len(hashes) < 2 or len(text) > _HOLD_CHARS:
            return False  # (a long prompt is tokenized off the loop only: the anchoring thread's)
        exact = [w for w in self.workers.values() if w.exact]
        if not any(s.blocks.device for w in exact for s in w.streams):
            return False  # nothing cached anywhere: unseen it is
        kind = self.kind(endpoint, body)
        keys = self.keys(kind, body, hashes)
        need = max(1, int(threshold * len(hashes)))
        if all(self.table(w.space(), kind).depth(keys) >= need for w in exact):
            return False  # anchored deep enough: the rest is anchored after routing
        now = time.monotonic()
        self._budget = min(self.first_sight_budget, self._budget + (now - self._budget_at) * self.first_sight_budget)
        self._budget_at = now
        if self._budget <= 0:
            self.first_sight["over_budget"] += 1
            return False
        if not self._lock.acquire(blocking=False):  # the anchoring thread is building: never wait for it here
            self.first_sight["over_budget"] += 1
            return False
        t0 = time.perf_counter()
        try:
            self.build(endpoint, body, text, list(hashes), full_key(hashes, text, self.block_chars))
        finally:
            self._lock.release()
        took = time.perf_counter() - t0
        self._budget -= took
        self.first_sight["anchored"] += 1
        self.first_sight["seconds"] += took
        return True

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
        spaces = {w.space() for w in self.workers.values()}
        kind = self.kind(endpoint, body)
        keys = self.keys(kind, body, hashes)
        if all(self.table(s, kind).known(fk) and self.table(s, kind).depth(keys) == len(keys) for s in spaces):
            return
        if len(text) > self.anchor_max_chars:
            self.anchor_skipped["too_long"] += 1
            return
        if len(text) > _HOLD_CHARS and not answered:  # anchored once the worker answered it (`account`)
            self._held[fk] = (endpoint, body, text, hashes, fk)
            self._held.move_to_end(fk)
            if len(self._held) > _HOLD_MAX:
                self._held.popitem(last=False)
                self.anchor_skipped["unanswered"] += 1
            return
        self._enqueue((endpoint, body, text, hashes, fk))

    def _enqueue(self, item: tuple[str, dict[str, Any], str, list[int], int]) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(item)
        if self._wake is not None:
            self._wake.set()

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
        held = self._held.pop(full_key, None) if full_key is not None else None
        if held is not None:
            self._enqueue(held)
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

    async def _builder(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                # Yield first: the request that queued this prompt woke us from its routing decision, and
                # its upstream request is a task started after that wake-up, so behind us in the loop's
                # queue. Built at once, the prompt's tokenizing (a few hundred µs for 1,300 tokens) ran
                # before the worker got the request: on the request's own TTFT.
                await asyncio.sleep(0)
                if not self._queue:
                    break
                item = self._queue.pop()  # newest first: the next requests most likely share it
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferctl-kv-anchor")
                try:
                    await asyncio.get_running_loop().run_in_executor(self._pool, self._build_locked, item)
                except Exception:  # a prompt that cannot be anchored only costs its exactness
                    log.exception("KV events: anchoring a prompt failed")

    def _build_locked(self, item: tuple[str, dict[str, Any], str, list[int], int]) -> None:
        with self._lock:
            self.build(*item)

    def build(self, endpoint: str, body: dict[str, Any], text: str, hashes: list[int], fk: int) -> None:
        view = self.view
        if view is None:
            return
        t0 = time.perf_counter()
        got = view.view(endpoint, body, text, len(hashes), self.block_chars)
        if got is None:
            return
        worker_text, ends, tok = got
        kind = self.kind(endpoint, body)
        keys = self.keys(kind, body, hashes)
        keys = keys.materialize() if isinstance(keys, ChatKeys) else keys
        for space in {w.space() for w in self.workers.values()}:
            self.table(space, kind).build(keys, fk, worker_text, tok, ends)
        self.build_seconds += time.perf_counter() - t0

    def drain_builds(self) -> None:
        """Anchor everything queued now (tests, and the moment before a benchmark measures)."""
        while self._queue:
            self._build_locked(self._queue.pop())

    # ---- views ----------------------------------------------------------------------------------------
    def worker_doc(self, url: str, role: str = "prefill") -> dict[str, Any]:
        """A worker's index for `router workers`. A decode has no predicted index: its `index` is its
        streams' state (exact, replaying, untrusted, down), or absent when it is not subscribed."""
        w = self.workers.get(url)
        decode = role == "decode"
        if w is None:
            why = self.skipped.get(url) or ("no KV events" if self.enabled else "KV events off")
            return {"index_reason": why} if decode else {"index": "predicted", "index_reason": why}
        if self.view is None and not decode:
            return {"index": "predicted", "index_reason": self.view_reason}
        state = w.state
        return {
            "index": state if decode else "exact" if state == "exact" else state if state == "replaying" else "predicted",
            "index_reason": next((s.reason for s in w.streams if s.state != "exact"), "in sync"),
            "kv_blocks": sum(len(s.blocks) for s in w.streams),
            "kv_media": _media(w.streams),
            "page_size": w.page_size, "bigram": w.bigram,
            "cached_tokens": {"requests": w.requests, "exact": w.exact_tokens, "predicted": w.predicted_tokens,
                              "reported": w.reported_tokens},
            "kv_streams": [s.as_dict() for s in w.streams],
        } | ({"cached_tokens": None} if decode else {})

    def status_doc(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "tokenizer": self.view.name if self.view else None,
                "tokenizer_reason": self.view_reason,
                "workers": {u: w.state for u, w in self.workers.items()},
                "anchors": {f"{kind}/page {ps}{' bigram' if bg else ''}": len(t)
                            for (ps, bg, kind), t in self.tables.items()},
                "anchor_builds_dropped": self.dropped, "anchor_build_seconds": round(self.build_seconds, 3),
                "anchor_skipped": dict(self.anchor_skipped), "anchor_held": len(self._held),
                **({"first_sight": {**self.first_sight, "seconds": round(self.first_sight["seconds"], 3)}}
                   if self.first_sight_budget > 0 else {})}


def _media(streams: Sequence[Any]) -> dict[str, int]:
    """Blocks per storage medium over a worker's streams (GPU, CPU_PINNED, ...): which tier the
    `router workers` line shows (a page backed up to host counts once per medium)."""
    out: dict[str, int] = {}
    for s in streams:
        for m, n in s.blocks.snapshot().items():
            out[m] = out.get(m, 0) + n
    return out
