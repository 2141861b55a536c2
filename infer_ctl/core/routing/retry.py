"""Retry decisions, pure: may a failed attempt be retried, after how long, on which workers, how many
attempts in all, and what the client gets when every one failed. The router's attempt loop
(router/request/retry.py) and the places that classify an answer call these; nothing else decides.

A failure is retryable while nothing went to the client (the relay ends a stream that breaks after its
first byte with an error event instead): a transport error, a stream that ends before its first byte, or an
HTTP status in RETRYABLE_STATUS from either worker. Other 4xx answers are the client's: passed on, never
retried.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

#: statuses that say "try elsewhere" (408 and 429 included: another worker may have room)
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
#: "later" statuses: when every attempt ended in one of these, the worker's own answer is passed on (its
#: message and Retry-After) instead of the router's 502
LATER_STATUS = frozenset({408, 429})

W = TypeVar("W")


def retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS


def attempts(max_retries: int) -> int:
    """How many attempts a request gets in all: the first and `max_retries` retries."""
    return 1 + max_retries


def backoff_s(attempt: int, rand: float, *, base_s: float, mult: float = 2.0, cap_s: float = 1.0,
              jitter: float = 0.5) -> float:
    """Delay before retry `attempt` (1-based): exponential, capped, with +-jitter; `rand` in [0, 1)."""
    raw = min(cap_s, base_s * mult ** max(0, attempt - 1))
    return max(0.0, raw * (1.0 + jitter * (2.0 * rand - 1.0)))


def next_candidates(pool: Sequence[W], excluded: Collection[str], url: Callable[[W], str],
                    ok: Callable[[W], bool]) -> Sequence[W]:
    """The workers a retry chooses among: those that have not failed this request (`excluded`) and are
    available (`ok`); none such, the whole pool rather than nothing (a retry that found only unavailable ones
    besides the worker that failed goes to that one again, as it does where that worker is alone in its role)."""
    if not excluded:
        return pool
    return [w for w in pool if url(w) not in excluded and ok(w)] or pool


def pass_on_answer(status: int, body: bytes) -> bool:
    """Every attempt failed, the last with `status` and `body`: pass the worker's answer on (a "later"
    status with a body) instead of the router's 502."""
    return status in LATER_STATUS and bool(body)
