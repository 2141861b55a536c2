"""The anchor tables and how prompts get into them: a background task, and a budgeted first sight.

An anchor ties a prompt's routing-text blocks to the worker's token pages (core/routing/anchors.py):
one table per (page size, bigram keys, prompt kind). Anchoring tokenizes the whole prompt: 2 s for a 1
MB prompt, 16 s for 29 MB (under the 32 MiB body limit), a one-request denial of service when it ran on
the event loop (issue 28). So it runs on one worker thread (the tokenizer releases the GIL:
kv_prompts.py; the rest yields every switch interval), one prompt at a time under `_lock` (the request
path's first-sight anchoring takes it only when free); the loop's readers only look up single dict
entries, each atomic. A prompt over `anchor_max_chars` is not anchored (routed on the predicted index;
counted), and one over `HOLD_CHARS` waits for its worker's answer (`answered`): a prompt the worker
rejected (over its context, malformed) is never tokenized. Smaller ones are anchored at once, as cheap
as the lookups (and the next request with their prefix wants them before the answer). The queue runs
newest first when it falls behind (a prompt it drops is anchored the next time it comes).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from infer_ctl.core.routing.anchors import AnchorTable
from infer_ctl.router.kvindex.kv_prompts import ChatKeys, PromptView, chat_layout, view_for

log = logging.getLogger("infer_ctl.router.kv")

#: prompts longer than this (characters) are anchored only once their worker answered (module docstring)
HOLD_CHARS = 32 << 10
#: prompts held for an answer at most: the oldest is forgotten (a request that never got one)
_HOLD_MAX = 256

Space = tuple[int, bool]
Item = tuple[str, dict[str, Any], str, list[int], int]


def prompt_kind(endpoint: str, body: dict[str, Any]) -> str:
    """Which anchors a prompt uses: a chat's routing text can start like a plain prompt's while the
    worker sees its template around it, so each kind has its own (chat, ids, text)."""
    if endpoint.endswith("/chat/completions"):
        return "chat"
    if not endpoint.endswith("/completions") and body.get("text") is None and body.get("input_ids") is not None:
        return "ids"
    return "text"


class Anchoring:
    def __init__(self, *, block_chars: int, max_anchors: int, anchor_max_chars: int,
                 spaces: Callable[[], set[Space]]) -> None:
        self.block_chars = block_chars
        self.max_anchors = max_anchors
        #: the longest prompt (characters of routing text) anchored; longer ones are routed on the
        #: predicted index (`skipped["too_long"]`)
        self.anchor_max_chars = anchor_max_chars
        #: the key spaces of the subscribed workers, now (a prompt is anchored in each)
        self.spaces = spaces
        #: how prompts are tokenized as the workers do (None: no tokenizer yet, and why)
        self.view: PromptView | None = None
        self.view_reason = "no prefill reported its tokenizer yet"
        #: the reasons for no tokenizer already logged (`choose_view`)
        self._view_logged: set[str] = set()
        self.tables: dict[tuple[int, bool, str], AnchorTable] = {}
        self.skipped = {"too_long": 0, "unanswered": 0}
        self.held: OrderedDict[int, Item] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._queue: deque[Item] = deque(maxlen=512)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self.build_seconds = 0.0
        #: seconds per second this process may spend anchoring, on the request path, prompts it has not
        #: anchored deeply enough while the workers hold blocks (another replica's, process's or
        #: frontend's traffic may have cached them: `first_sight`); 0: off, every prompt is anchored
        #: after its first routing only (router/scaleout/state_sync.py sets the replicas' budget)
        self.first_sight_budget = 0.05
        self._budget = 0.0
        self._budget_at = time.monotonic()
        self.first_sight_counts = {"anchored": 0, "over_budget": 0, "seconds": 0.0}

    # ---- lifecycle ----------------------------------------------------------------------------------

    def choose_view(self, info: dict[str, Any], tokenizer_path: str | None, url: str) -> None:
        """The first prefill's /server_info (or the router's tokenizer_path) chooses how prompts are
        tokenized; until one does, every worker routes on the predicted index."""
        if self.view is not None:
            return
        self.view, self.view_reason = view_for(info, tokenizer_path)
        if self.view is not None:
            log.info("KV events: prompts tokenized with " + self.view_reason, extra={"worker": url})
        elif self.view_reason not in self._view_logged:
            # once per cause: every health check configures every worker again (a warning each 5 s)
            self._view_logged.add(self.view_reason)
            log.warning("KV events: no tokenizer, every worker routed on the predicted index: " + self.view_reason,
                        extra={"worker": url})
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._builder())

    async def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    # ---- the tables ---------------------------------------------------------------------------------
    def table(self, space: Space, kind: str) -> AnchorTable:
        t = self.tables.get((*space, kind))
        if t is None:
            t = self.tables[(*space, kind)] = AnchorTable(space[0], bigram=space[1], block_chars=self.block_chars,
                                                          max_anchors=self.max_anchors)
        return t

    def keys(self, kind: str, body: dict[str, Any], hashes: Sequence[int]) -> Sequence[int]:
        """The anchor keys of a prompt's blocks: the block chain, keyed with the roles for a chat."""
        if kind != "chat":
            return hashes
        msgs = body.get("messages")
        starts, _, _, roles = chat_layout(msgs if isinstance(msgs, list) else [])
        return ChatKeys(hashes, starts, roles, self.block_chars)

    # ---- what gets anchored -------------------------------------------------------------------------
    def routed(self, endpoint: str, body: dict[str, Any], text: str, hashes: list[int], fk: int,
               answered: bool = False) -> None:
        """After a routing decision: anchor this prompt off the request path (once per new text)."""
        kind = prompt_kind(endpoint, body)
        keys = self.keys(kind, body, hashes)
        if all(self.table(s, kind).known(fk) and self.table(s, kind).depth(keys) == len(keys) for s in self.spaces()):
            return
        if len(text) > self.anchor_max_chars:
            self.skipped["too_long"] += 1
            return
        if len(text) > HOLD_CHARS and not answered:  # anchored once the worker answered it (`answered`)
            self.held[fk] = (endpoint, body, text, hashes, fk)
            self.held.move_to_end(fk)
            if len(self.held) > _HOLD_MAX:
                self.held.popitem(last=False)
                self.skipped["unanswered"] += 1
            return
        self._enqueue((endpoint, body, text, hashes, fk))

    def answered(self, fk: int) -> None:
        """A worker answered the prompt of full key `fk`: anchored now if it was held for that."""
        held = self.held.pop(fk, None)
        if held is not None:
            self._enqueue(held)

    def first_sight(self, endpoint: str, body: dict[str, Any], text: str, hashes: Sequence[int], fk: int,
                    kind: str, keys: Sequence[int], exact_spaces: Sequence[Space], threshold: float,
                    depths: dict[Space, int]) -> bool:
        """KvRouting.lookup past its fleet checks: anchor now, on the request path, a prompt the anchors
        of some exact worker's space cover under `threshold` of, within `first_sight_budget` of this
        process's time and never waiting for the anchoring thread. `depths` gets the anchor depth of
        `keys` (of `kind`) per space (for the lookup after this), emptied when it anchored. Returns whether
        it did."""
        need = max(1, int(threshold * len(hashes)))
        for space in exact_spaces:
            if space not in depths:
                t = self.tables.get((*space, kind))
                depths[space] = t.depth(keys) if t is not None else 0
        if min(depths.values(), default=need) >= need:
            return False  # anchored deep enough: the rest is anchored after routing
        now = time.monotonic()
        self._budget = min(self.first_sight_budget, self._budget + (now - self._budget_at) * self.first_sight_budget)
        self._budget_at = now
        if self._budget <= 0:
            self.first_sight_counts["over_budget"] += 1
            return False
        if not self._lock.acquire(blocking=False):  # the anchoring thread is building: never wait for it here
            self.first_sight_counts["over_budget"] += 1
            return False
        t0 = time.perf_counter()
        try:
            self.build(endpoint, body, text, list(hashes), fk)
        finally:
            self._lock.release()
        took = time.perf_counter() - t0
        self._budget -= took
        self.first_sight_counts["anchored"] += 1
        self.first_sight_counts["seconds"] += took
        depths.clear()  # anchored deeper now
        return True

    def _enqueue(self, item: Item) -> None:
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(item)
        if self._wake is not None:
            self._wake.set()

    def status(self) -> dict[str, Any]:
        """The anchoring's part of the KV status document."""
        return {"anchors": {f"{kind}/page {ps}{' bigram' if bg else ''}": len(t)
                            for (ps, bg, kind), t in self.tables.items()},
                "anchor_builds_dropped": self.dropped, "anchor_build_seconds": round(self.build_seconds, 3),
                "anchor_skipped": dict(self.skipped), "anchor_held": len(self.held),
                **({"first_sight": {**self.first_sight_counts, "seconds": round(self.first_sight_counts["seconds"], 3)}}
                   if self.first_sight_budget > 0 else {})}

    # ---- building -----------------------------------------------------------------------------------
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

    def _build_locked(self, item: Item) -> None:
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
        kind = prompt_kind(endpoint, body)
        keys = self.keys(kind, body, hashes)
        keys = keys.materialize() if isinstance(keys, ChatKeys) else keys
        for space in self.spaces():
            self.table(space, kind).build(keys, fk, worker_text, tok, ends)
        self.build_seconds += time.perf_counter() - t0

    def drain(self) -> None:
        """Anchor everything queued now (tests, and the moment before a benchmark measures)."""
        while self._queue:
            self._build_locked(self._queue.pop())
