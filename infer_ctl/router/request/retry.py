"""Retries: the attempt loop, by the decisions of core/routing/retry.py.

An attempt fails retryably - `AttemptFailed` - on a transport error, on an HTTP status the decisions call
retryable from either worker (`check_status`: overload, timeout, server error) or when a stream ends before
its first byte; never once a byte went to the client (the relay ends a broken stream with an error event
instead). Each retry runs on a new pair, the failed worker excluded (the picker's candidates:
core/routing/retry.py `next_candidates`), with a new bootstrap room (the attempt builds a fresh payload),
after a jittered exponential backoff (`backoff_s`). 4xx answers are the client's and are passed on, never
retried.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from infer_ctl.core.routing.policy import NoWorkerAvailable
from infer_ctl.core.routing.retry import attempts, backoff_s, retryable_status
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.request.context import RequestContext

log = logging.getLogger("infer_ctl.router")

R = TypeVar("R")
Pick = Callable[[RequestContext, set[str]], tuple[WorkerState, WorkerState | None]]
Attempt = Callable[[RequestContext, WorkerState, WorkerState | None], Awaitable[R]]
Observe = Callable[[WorkerState, WorkerState | None, "AttemptFailed | None"], None]


class AttemptFailed(Exception):
    """One attempt failed before anything went to the client. `cause` labels the retry metric; `status`
    and `body` are the worker's answer when it gave one (passed on when no attempt is left)."""

    def __init__(self, cause: str, worker: str, message: str, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.cause, self.worker, self.message, self.status, self.body = cause, worker, message, status, body


class RetriesExhausted(Exception):
    """Every attempt failed (or no worker was left to try after a failure); `last` is the last failure."""

    def __init__(self, last: AttemptFailed, attempts: int) -> None:
        super().__init__(last.message)
        self.last, self.attempts = last, attempts


def check_status(cause: str, worker: WorkerState, status: int, body: bytes, who: str = "") -> None:
    """The one classification of a worker's HTTP answer: raise AttemptFailed when it is retryable. Runs
    on every answer: the message is built only for a failure."""
    if retryable_status(status):
        raise AttemptFailed(cause, worker.url, f"{who}HTTP {status}", status, body)


async def with_retries(ctx: RequestContext, pick: Pick, attempt: Attempt[R], *, max_retries: int, base_s: float,
                       rng: random.Random, metrics: RouterMetrics, observe: Observe | None = None) -> R:
    """Run `attempt` on the pair `pick` chooses until one does not raise AttemptFailed, at most
    1 + max_retries times. Raises NoWorkerAvailable when not even the first attempt found a pair, and
    RetriesExhausted when every attempt failed. `observe(pre, dec, failure)` hears how each attempt ended
    (failure None: it succeeded; the pair health of router/fleet/pair_health.py)."""
    excluded: set[str] = set()
    last: AttemptFailed | None = None
    for n in range(attempts(max_retries)):
        if last is not None:
            metrics.retries.labels(last.cause).inc()
            await asyncio.sleep(backoff_s(n, rng.random(), base_s=base_s))
        try:
            pre, dec = pick(ctx, excluded)
        except NoWorkerAvailable:
            if last is None:
                raise
            break
        ctx.attempts = n + 1
        try:
            result = await attempt(ctx, pre, dec)
        except AttemptFailed as failure:
            if observe is not None:
                observe(pre, dec, failure)
            last = failure
            excluded.add(failure.worker)
            log.warning("attempt failed", extra={"rid": ctx.rid, "attempt": n + 1, "worker": failure.worker,
                                                 "cause": failure.cause, "error": failure.message})
            continue
        if observe is not None:
            observe(pre, dec, None)
        return result
    assert last is not None
    metrics.retries.labels("exhausted").inc()
    raise RetriesExhausted(last, ctx.attempts)
