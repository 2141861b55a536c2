"""What a successful answer teaches the router: the characters-per-token ratio (index blocks are in
characters, workers count tokens), predicted vs reported cached tokens (the index-accuracy metrics),
the named prefix's statistics (which trigger a re-warm when it was evicted), the correction of the
predicted index by the reported cached tokens, and the per-request log line.

The ratio (`TokenRatio`) starts at CHARS_PER_TOKEN (core/routing/units.py) and is learned from the first answers at once (their mean, then a
slow moving average), and a change is passed on (its `on_change`) so each prefill's index capacity, which
is converted with it, is corrected now rather than at the next health check.

The correction: when a prefill reports clearly fewer cached tokens than the predicted index matched,
it evicted (or was flushed, or filled by traffic that bypassed the router). The prompt itself is cached
there again now (SGLang inserts it after the prefill), so what is dropped is what its LRU dropped first:
every entry of that worker used no later than the deepest block the prediction relied on
(`PrefixIndex.forget_older`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.core.routing.units import CHARS_PER_TOKEN, ratio
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.usage import token_counts, usage_totals

log = logging.getLogger("infer_ctl.router")


class TokenRatio:
    """The characters-per-token estimate, learned from the answers (prompt chars / prompt tokens). Its own
    object, built before everything that converts with it (the exact index, the coalescer, the tenants'
    token estimates), which read it through `get`; Feedback teaches it."""

    def __init__(self, on_change: Callable[[float], None] | None = None) -> None:
        self.value = CHARS_PER_TOKEN
        #: called with the new ratio when it moved by 10 % or more (router: index capacities)
        self.on_change = on_change
        self._seen = (0, 0)  # characters and tokens of the first answers (their mean comes first)
        self._passed = CHARS_PER_TOKEN

    def get(self) -> float:
        return self.value

    def learn(self, chars: int, tokens: int) -> None:
        n_chars, n_tokens = self._seen
        if n_tokens < 20_000:  # the first answers: their mean, not a slow average away from the guess
            n_chars, n_tokens = n_chars + chars, n_tokens + tokens
            self._seen = (n_chars, n_tokens)
            self.value = n_chars / n_tokens
        else:
            self.value = 0.95 * self.value + 0.05 * (chars / tokens)
        if self.on_change is not None and abs(self.value / self._passed - 1.0) >= 0.1:
            self._passed = self.value
            self.on_change(self.value)


class Feedback:
    def __init__(self, prefixes: PrefixRegistry, *, ratio: TokenRatio, clock: Callable[[], float],
                 metrics: RouterMetrics, log_requests: bool, spec: SpecStats | None = None,
                 index: PrefixIndex | None = None, kv: KvRouting | None = None) -> None:
        self.prefixes = prefixes
        #: learned from responses (prompt chars / prompt tokens): converts index characters to tokens
        self.ratio = ratio
        #: speculative acceptance per decode and workload label (router/observe/spec_stats.py)
        self.spec = spec
        self.clock = clock
        self.metrics = metrics
        self.log_requests = log_requests
        #: the predicted index (corrected by reported cached tokens) and the exact index's accounting
        self.index = index
        self.kv = kv

    @property
    def chars_per_token(self) -> float:
        return self.ratio.value

    def answered(self, ctx: RequestContext, pre: WorkerState, obj: Any) -> None:
        """`obj`: the answer's JSON (the last event's for a stream; None when it did not parse)."""
        prompt_tokens, cached = token_counts(obj)
        if prompt_tokens and ctx.text:
            self.ratio.learn(len(ctx.text), prompt_tokens)
        cpt = ratio(self.chars_per_token)
        predicted = ctx.predicted_tokens if ctx.predicted_tokens is not None else int(ctx.predicted_chars / cpt)
        if cached is not None and not ctx.exact:
            self._correct(ctx, pre, predicted, cached, cpt)
        if self.kv is not None:
            self.kv.account(pre.url, exact=predicted if ctx.exact else None, predicted=int(ctx.predicted_chars / cpt),
                            prompt_tokens=prompt_tokens, reported=cached, full_key=ctx.full_key)
        m = self.metrics
        m.predicted_tokens.inc(predicted)
        if prompt_tokens:
            m.prompt_tokens.inc(prompt_tokens)
        if cached is not None:
            m.actual_tokens.inc(cached)
        if completion := usage_totals(obj)[2]:  # a /generate batch: every item's (as the tenants count)
            m.output_tokens.inc(completion)
        if ctx.named is not None:
            self.prefixes.record_response(ctx.named, pre.url, predicted_tokens=predicted, prompt_tokens=prompt_tokens or 0,
                                          cached_tokens=cached, prefix_tokens=int(len(ctx.named.text) / cpt),
                                          now=self.clock())
        if self.spec is not None:  # the worker that generated the answer: the decode, or the collocated one
            self.spec.answered(ctx.decode or pre.url, ctx.body, ctx.request.headers,
                               ctx.named.name if ctx.named else None, obj)
        if ctx.obs is not None:  # tracing and tenants: tokens, the span's usage attributes
            ctx.obs.answered(ctx, obj, predicted)
        if self.log_requests:
            log.info("request done", extra={"rid": ctx.rid, "endpoint": ctx.endpoint, "prefill": ctx.prefill,
                                            "decode": ctx.decode, "reason": ctx.reason, "attempts": ctx.attempts,
                                            "predicted_tokens": predicted, "cached_tokens": cached,
                                            **({"coalesced": ctx.coalesced} if ctx.coalesced else {})})

    def _correct(self, ctx: RequestContext, pre: WorkerState, predicted: int, cached: int, cpt: float) -> None:
        index = self.index
        if index is None or ctx.seen is None or predicted <= 0:
            return
        margin = max(2 * index.block_chars / cpt, 0.1 * predicted)
        if cached + margin < predicted:
            dropped = index.forget_older(pre.url, ctx.seen)
            if dropped:
                log.info("prefill reported fewer cached tokens than predicted: dropped what its LRU evicted",
                         extra={"worker": pre.url, "predicted_tokens": predicted, "cached_tokens": cached,
                                "entries": dropped})
