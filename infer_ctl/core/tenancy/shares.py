"""The share clock: a worker's time split between the requests in flight on it.

A worker serves its requests together (continuous batching), so one request's share of the worker over
an interval is dt / n, with n the requests in flight then. The clock integrates S(t) = ∫ dt / n(t)
(advanced at every arrival and departure, O(1)); a request's share is S(leave) - S(enter), in
worker-seconds. Shares of all requests plus the idle time (n = 0) add up to the elapsed time exactly,
so the cost attributed to requests plus the idle cost is the worker's whole lease.
"""

from __future__ import annotations


class ShareClock:
    __slots__ = ("idle_s", "inflight", "last", "shared_s", "started")

    def __init__(self, now: float) -> None:
        self.started = now
        self.inflight = 0
        self.shared_s = 0.0  # S(t): worker-seconds per request since the start
        self.idle_s = 0.0  # time with nothing in flight
        self.last = now

    def advance(self, now: float) -> None:
        dt = now - self.last
        if dt > 0:
            if self.inflight:
                self.shared_s += dt / self.inflight
            else:
                self.idle_s += dt
            self.last = now

    def enter(self, now: float) -> float:
        """A request starts on the worker; returns the mark to give to `leave`."""
        self.advance(now)
        self.inflight += 1
        return self.shared_s

    def leave(self, now: float, mark: float) -> float:
        """The request entered at `mark` ends; returns its share of the worker in worker-seconds."""
        self.advance(now)
        self.inflight -= 1
        return self.shared_s - mark
