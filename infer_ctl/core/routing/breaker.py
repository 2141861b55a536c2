"""Per-worker circuit breaker (closed -> open -> half-open -> closed), time passed in.

`failure_threshold` consecutive failures open it; after `open_s` it lets `half_open_probes` requests
through at a time; `success_threshold` consecutive successes close it, any failure re-opens it.
Client errors (4xx) are not failures of the worker and must be recorded as successes by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    @property
    def gauge(self) -> int:
        return {"closed": 0, "open": 1, "half_open": 2}[self.value]


@dataclass(kw_only=True)
class CircuitBreaker:
    #: the router's cb_failures, cb_successes and cb_open_s (profile/router.py declares them; router/config.py
    #: `circuit_breaker` builds this): no default here
    failure_threshold: int
    success_threshold: int
    open_s: float
    half_open_probes: int = 1
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    successes: int = 0
    opened_at: float = 0.0
    probes: int = 0

    def allows(self, now: float) -> bool:
        """Would a request be let through now? (No side effect; `acquire` takes a probe slot.)"""
        if self.state is BreakerState.CLOSED:
            return True
        if self.state is BreakerState.OPEN:
            return now - self.opened_at >= self.open_s
        return self.probes < self.half_open_probes

    def acquire(self, now: float) -> bool:
        if self.state is BreakerState.OPEN and now - self.opened_at >= self.open_s:
            self.state = BreakerState.HALF_OPEN
            self.probes = 0
            self.successes = 0
        if self.state is BreakerState.HALF_OPEN:
            if self.probes >= self.half_open_probes:
                return False
            self.probes += 1
            return True
        return self.state is BreakerState.CLOSED

    def release(self) -> None:
        """An `acquire` that sent nothing (the other half of a PD pair was not found): its probe slot is
        free again. Kept, a half-open breaker would let no request through until the worker's next
        readmission, as though its probe were still in flight."""
        if self.state is BreakerState.HALF_OPEN:
            self.probes = max(0, self.probes - 1)

    def record(self, ok: bool, now: float) -> None:
        if self.state is BreakerState.HALF_OPEN:
            self.probes = max(0, self.probes - 1)
            if not ok:
                self._open(now)
                return
            self.successes += 1
            if self.successes >= self.success_threshold:
                self.state = BreakerState.CLOSED
                self.failures = 0
            return
        if ok:
            self.failures = 0
            return
        self.failures += 1
        if self.state is BreakerState.CLOSED and self.failures >= self.failure_threshold:
            self._open(now)

    def reset(self) -> None:
        if self.state is not BreakerState.CLOSED:
            self.state = BreakerState.CLOSED
        self.failures = self.successes = self.probes = 0

    def _open(self, now: float) -> None:
        self.state = BreakerState.OPEN
        self.opened_at = now
        self.successes = 0

