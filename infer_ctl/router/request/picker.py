"""Routing one attempt: which prefill (or collocated worker) and which decode get it.

The choice itself is pure (core/routing/policy.py); this module feeds it the workers' live state,
takes a circuit-breaker slot on the chosen worker (a half-open breaker lets one probe through) and
records the decision. The router *predicts* the cache: the chosen prefill is assumed to hold the
prompt's blocks from now on (`index.insert`), with or without KV events. With the workers' KV events
(router/kvindex/kv_routing.py) the exact index learns what each worker holds from the worker itself;
this module reads it as the policy's input where a worker's stream is trusted (`_exact`, the predicted
index for the others) and hands it the routed prompt to anchor (`kv.routed`).

A long prompt (`_long`) is predicted only once the worker took it (its first byte or 2xx answer,
attempt.py `landed`): inserted at routing time, a prompt the worker then rejects (over its context, 4xx)
would have evicted the prediction of everything else on that worker for nothing.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence

from infer_ctl.core.routing import units
from infer_ctl.core.routing.capacity import kv_need
from infer_ctl.core.routing.coalesce import PendingBlocks
from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.policy import (
    NoWorkerAvailable,
    PolicyConfig,
    choose_decode,
    choose_prefill,
    placement_key,
)
from infer_ctl.core.routing.retry import next_candidates
from infer_ctl.core.tenancy.buckets import retry_after_s
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.pair_health import PairTracker
from infer_ctl.router.fleet.workers import WorkerRegistry, WorkerState
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.next_turn import NextTurn

log = logging.getLogger("infer_ctl.router")


class PairPicker:
    def __init__(self, workers: WorkerRegistry, index: PrefixIndex, policy: PolicyConfig, *, rng: random.Random,
                 clock: Callable[[], float], metrics: RouterMetrics, pairs: PairTracker | None = None,
                 kv: KvRouting | None = None, pending: PendingBlocks | None = None,
                 sync_pending: Callable[[Sequence[str], Sequence[int]], None] | None = None,
                 long_chars: int | None = None) -> None:
        self.workers = workers
        self.index = index
        self.policy = policy
        self.rng = rng
        self.clock = clock
        self.metrics = metrics
        #: degraded prefill x decode pairs are avoided (router/fleet/pair_health.py); None: no pair health
        self.pairs = pairs
        #: the exact index from the workers' KV events (router/kvindex/kv_routing.py); None: off
        self.kv = kv
        #: in-flight prompts per worker (router/request/coalesce.py), counted as held on exact workers; None: off
        self.pending = pending
        #: brings the overlay's flights of the other router processes up to date, those on the workers
        #: given that a chain starting as the hashes given may share blocks with (router/request/coalesce.py `sync`)
        self.sync_pending = sync_pending
        #: a prompt over this many characters is predicted only once its worker answered (`_long`; the
        #: router's kv_events.anchor_max_chars, the exact index's bound); None: only the capacity rule
        self.long_chars = long_chars
        #: decision counter: round-robin position and tie-breaks
        self.seq = 0
        #: a decision's bookkeeping, run after the upstream write (`_after_write`)
        self._later: deque[Callable[[], None]] = deque()
        #: `settle` at the loop's next turn (router/request/next_turn.py)
        self._next_turn = NextTurn(self._settle)

    def pick(self, ctx: RequestContext, excluded: set[str]) -> tuple[WorkerState, WorkerState | None]:
        """The pair for the next attempt (decode None in collocated mode); prefers workers not in
        `excluded` (those that failed this request). Raises NoWorkerAvailable."""
        t = time.perf_counter()
        now = self.clock()
        workers = self.workers
        pd = bool(workers.role("prefill", "decode"))
        prefills = workers.role("prefill") if pd else workers.prefill_like()
        pairs = self.pairs if pd and self.pairs is not None and self.pairs.active else None
        decodes = workers.role("decode") if pd else []
        pre = self._choose(ctx, prefills if pairs is None else pairs.prefills(prefills, decodes, now), excluded, now,
                           True, pd, decodes)
        dec: WorkerState | None = None
        if pd:
            try:
                dec = self._choose(ctx, decodes if pairs is None else pairs.decodes(pre.url, decodes, now), excluded,
                                   now, False, pd, near=self.workers.near(pre.url))
            except NoWorkerAvailable:
                pre.breaker.release()  # the prefill's half-open probe slot, taken for a request never sent
                raise
            if pairs is not None:
                pairs.chosen(pre.url, dec.url, now)
        if ctx.hashes:
            if self._long(ctx, pre.url):  # predicted once the worker took it (module docstring)
                ctx.on_landed = self._predict_answered(ctx.hashes, pre.url)
            else:
                ctx.on_landed = None  # a retry's: an earlier attempt's worker did not take it
                # the prediction (module docstring), applied after the upstream write: before any other
                # use of the index (core/routing/index.py `insert_later`), so no request misses it
                self.index.insert_later(ctx.hashes, pre.url, now)
            if self.kv is not None and ctx.full_key is not None:  # anchor the prompt, off the request path
                self._later.append(functools.partial(self.kv.routed, ctx.endpoint, ctx.body, ctx.text, ctx.hashes,
                                                     ctx.full_key))
        ctx.prefill, ctx.decode = pre.url, dec.url if dec else ""
        self._later.append(functools.partial(self.metrics.observe_decision, ctx.reason, time.perf_counter() - t))
        self._after_write()
        return pre, dec

    def _after_write(self) -> None:
        """Run the decision's bookkeeping (the prediction, the anchoring's queue, the decision metric) at
        the event loop's next turn: after this request's upstream write, which follows the decision in
        the same turn, so none of it is on the request's time to first token. Without a running loop
        (a test calling pick alone) it runs now."""
        if not self._next_turn.soon():
            self.settle()

    def settle(self) -> None:
        """The deferred bookkeeping, now (`_after_write`). A step that raises is logged and loses only
        itself: the other decisions' steps run (raised out of the loop's callback, the rest were lost)."""
        self._next_turn.run()

    def _settle(self) -> None:
        try:
            self.index.settle()
        except Exception:
            log.exception("a routing decision's prediction failed")
        later = self._later
        while later:
            fn = later.popleft()
            try:
                fn()
            except Exception:
                log.exception("a routing decision's bookkeeping failed")

    def _long(self, ctx: RequestContext, url: str) -> bool:
        """Whether the prompt is predicted only once `url` took it: over `long_chars`, or over a quarter
        of the worker's predicted capacity (such a prompt evicts much of the worker's prediction, and a
        worker rejects the longest prompts: over its context length). Short prompts are predicted at
        routing time, which bursts and coalescing rely on (a follower must find its leader's blocks)."""
        if self.long_chars is not None and len(ctx.text) > self.long_chars:
            return True
        cap = self.index.capacity(url)
        return cap is not None and len(ctx.hashes) > cap // 4

    def _predict_answered(self, hashes: list[int], url: str) -> Callable[[], None]:
        def predict() -> None:
            self.index.insert(hashes, url, self.clock())
        return predict

    def _choose(self, ctx: RequestContext, pool: list[WorkerState], excluded: set[str], now: float, prefill: bool,
                pd: bool, decodes: list[WorkerState] | None = None, near: set[str] | None = None) -> WorkerState:
        """`decodes` (PD, choosing the prefill): the decodes the request needs too, whose wait the 503's
        Retry-After includes."""
        try:
            return self._choose_in(ctx, pool, excluded, now, prefill, pd, near)
        except NoWorkerAvailable as exc:  # the policy's or ours: say which workers only a hold-down keeps out
            held, wait = _holds(pool, now)
            if not held:
                raise
            if wait and decodes:
                # the request needs a decode too: back when both are, and unknown when the decode is
                # down without a hold-down (a prefill's Retry-After alone sent the client back to a 503)
                other = _holds(decodes, now)[1]
                wait = None if other is None else max(wait, other)
            raise NoWorkerAvailable(f"{exc} ({len(held)} answering but held down by flap damping after repeated "
                                    f"failures, the first back in {math.ceil(min(held))} s if it keeps answering)",
                                    retry_after_s=retry_after_s(wait) if wait else None) from None

    def _choose_in(self, ctx: RequestContext, pool: list[WorkerState], excluded: set[str], now: float, prefill: bool,
                   pd: bool, near: set[str] | None = None) -> WorkerState:
        # a retry prefers the workers that have not failed this request (core/routing/retry.py)
        cands = list(next_candidates(pool, excluded, _url, lambda w: w.available(now)))
        exact = self._exact(ctx, cands, now) if prefill else None
        key = placement_key(ctx.text) if prefill and self.policy.miss_placement == "rendezvous" else None
        for _ in range(len(cands) + 1):
            views = [w.view(now) for w in cands]
            self.seq += 1
            if prefill:
                choice = choose_prefill(hashes=ctx.hashes, text_chars=len(ctx.text), workers=views, index=self.index,
                                        now=now, cfg=self.policy, rng=self.rng, seq=self.seq,
                                        replicas=ctx.named.warm_replicas() if ctx.named else None, key=key,
                                        tokens=exact[0] if exact else None)
                ctx.predicted_chars, ctx.reason = choice.matched_chars, choice.reason
                if exact is not None:  # matched in prompt units: exact where the worker's stream is trusted
                    ctx.exact = choice.url in exact[1]
                    ctx.held_tokens = exact[2].get(choice.url)
                    ctx.predicted_tokens = choice.matched_chars
                    tw = self.kv.tier_weights if self.kv is not None else None
                    if ctx.exact and self.kv is not None and tw is not None and not tw.blind:
                        # the accounting compares it with what the worker reports (every tier): unweighted,
                        # which is the weighted number already looked up unless the worker holds lower tiers
                        ctx.predicted_tokens = self.kv.cached(ctx.hashes, ctx.text, [choice.url], self.kv.kind(
                            ctx.endpoint, ctx.body), ctx.body, weighted=False)[0].get(choice.url, 0) \
                            if self.kv.below_device(choice.url) else exact[2][choice.url]
                    # what the predicted index alone says, for `router workers` (exact vs predicted)
                    ctx.predicted_chars = self.index.match(ctx.hashes, [choice.url], now)[choice.url]
                else:  # a retry may take the predicted path after an exact first attempt
                    ctx.predicted_tokens, ctx.exact, ctx.held_tokens = None, False, None
                n = ctx.predicted_chars // self.index.block_chars
                ctx.seen = self.index.last_use(ctx.hashes[n - 1], choice.url) if n and not ctx.exact else None
            else:
                # decode chosen by capacity (core/routing/capacity.py): the KV the request may grow to
                need = kv_need(ctx.endpoint, ctx.body, len(ctx.text), units.ratio(
                    self.kv.chars_per_token() if self.kv is not None else None)) if self.workers.cfg.settings.decode_capacity else None
                choice = choose_decode(views, self.rng, policy="round_robin" if self.policy.policy == "round_robin" else "load",
                                       seq=self.seq, need=need, near=near)
                if need is not None:
                    self.workers.by_url[choice.url].routed(need)
            w = self.workers.by_url[choice.url]
            if w.breaker.acquire(now):
                return w
            cands = [c for c in cands if c is not w]
            if not cands:
                break
        raise NoWorkerAvailable(f"no available {'prefill ' if prefill and pd else '' if prefill else 'decode '}worker")

    def _exact(self, ctx: RequestContext, cands: list[WorkerState],
               now: float) -> tuple[units.ScoreInputs, set[str], dict[str, int]] | None:
        """The policy's KV-events inputs: cached prompt units per candidate, exact from the events where
        the worker's stream is trusted (tier-weighted), else the predicted index's match converted to
        tokens; and the workers whose number is exact, and their numbers before the pending overlay.
        The overlay (core/routing/coalesce.py): on an exact worker, the prompts routed there and not
        yet stored count as held, so a burst's followers go where its leader computes the prefix (the
        predicted index already counts them: `pick` inserts at routing time)."""
        kv = self.kv
        if kv is None or kv.view is None or not ctx.hashes or self.policy.policy != "cache_aware":
            return None
        urls = [w.url for w in cands]
        # a prompt no earlier request anchored deeply enough to qualify (its prefix reached the workers
        # another way, or it is new) is anchored first, within a time budget: a few ms once per prefix
        cached, ctx.full_key = kv.lookup(ctx.endpoint, ctx.body, ctx.text, ctx.hashes, urls,
                                         self.policy.cache_threshold)
        if not cached:
            return None
        cpt = units.ratio(kv.chars_per_token())
        pending: dict[str, int] = {}
        if self.pending is not None:
            if self.sync_pending is not None:
                self.sync_pending(list(cached), ctx.hashes)
            pending = {url: self.pending.depth(url, ctx.hashes) for url in cached}
        rest = [u for u in urls if u not in cached]
        inputs = units.score_inputs(
            event_tokens=cached, pending_blocks=pending,
            predicted_chars=self.index.match(ctx.hashes, rest, now) if rest else {},
            reported_prompt_tokens=kv.prompt_units(ctx.full_key, urls, kv.kind(ctx.endpoint, ctx.body)),
            text_chars=len(ctx.text),
            block_chars=self.index.block_chars, chars_per_token=cpt, queue_cost_tokens=kv.queue_cost,
            footprint_chars={u: kv.footprint_chars(u, cpt) if u in cached else self.index.footprint(u) for u in urls})
        return inputs, set(cached), cached


def _url(w: WorkerState) -> str:
    return w.url


def _holds(pool: list[WorkerState], now: float) -> tuple[list[float], float | None]:
    """The flap hold-downs left of the workers in `pool` that answer their checks and take no request
    (router/control/health.py): the 503 names them and when the first is let back if it keeps answering; without
    that it reads as though every worker were down. And how long until the pool can take a request where
    that is known (the 503's Retry-After): 0 when a worker can now, the first of those hold-downs to end
    when every other worker is held too, else None: one down without a hold-down is back on its next
    passing checks and one whose circuit breaker refuses on its next good probe, nobody knows when.
    Removed and draining workers count in neither: only the operator lets them back."""
    held: list[float] = []
    free = unknown = False
    for w in pool:
        if w.removed or w.draining:
            continue
        if w.flap_doc(now)["held"]:
            held.append(w.flap.left_s(now))
        elif w.available(now):
            free = True
        else:
            unknown = True
    return held, 0.0 if free else None if unknown or not held else min(held)
