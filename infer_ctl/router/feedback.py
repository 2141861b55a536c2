"""What a successful answer teaches the router: the characters-per-token ratio (index blocks are in
characters, workers count tokens), predicted vs reported cached tokens (the index-accuracy metrics),
the named prefix's statistics (which trigger a re-warm when it was evicted), and the per-request log
line. The correction of the index by the reported cached tokens (`PrefixIndex.forget_beyond`) belongs
here too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.router.context import RequestContext
from infer_ctl.router.metrics import RouterMetrics
from infer_ctl.router.spec_stats import SpecStats
from infer_ctl.router.usage import token_counts
from infer_ctl.router.workers import WorkerState

log = logging.getLogger("infer_ctl.router")


class Feedback:
    def __init__(self, prefixes: PrefixRegistry, *, clock: Callable[[], float], metrics: RouterMetrics,
                 log_requests: bool, spec: SpecStats | None = None) -> None:
        self.prefixes = prefixes
        #: speculative acceptance per decode and workload label (router/spec_stats.py)
        self.spec = spec
        self.clock = clock
        self.metrics = metrics
        self.log_requests = log_requests
        #: learned from responses (prompt chars / prompt tokens): converts index characters to tokens
        self.chars_per_token = 4.0

    def answered(self, ctx: RequestContext, pre: WorkerState, obj: Any) -> None:
        """`obj`: the answer's JSON (the last event's for a stream; None when it did not parse)."""
        prompt_tokens, cached = token_counts(obj)
        if prompt_tokens and ctx.text:
            self.chars_per_token = 0.95 * self.chars_per_token + 0.05 * (len(ctx.text) / prompt_tokens)
        cpt = self.chars_per_token or 4.0
        predicted = int(ctx.predicted_chars / cpt)
        m = self.metrics
        m.predicted_tokens.inc(predicted)
        if prompt_tokens:
            m.prompt_tokens.inc(prompt_tokens)
        if cached is not None:
            m.actual_tokens.inc(cached)
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
                                            "predicted_tokens": predicted, "cached_tokens": cached})
