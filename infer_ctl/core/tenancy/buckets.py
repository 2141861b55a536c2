"""Token buckets for per-tenant limits (requests per second, tokens per minute).

A bucket holds up to `capacity` units and refills at `rate` units per second. Requests take one unit
when admitted (`take`). A request's token count is known only when it finished, so a token bucket is
charged an estimate at admission (`charge`; core/tenancy/estimate.py: prompt + its max tokens) and
settled when it ends (`charge` the excess, or `credit` back what it did not use): it may go into debt,
and a tenant whose bucket is empty or in debt is refused until the refill brings it back above zero
(`wait_s`). Over a long run the tenant gets `rate` tokens per second whatever its request sizes, which
is what a tokens-per-minute limit promises. Because every admitted request's estimate is in the bucket
at once, the overshoot is bounded by one request: the last one admitted while the level was above zero,
plus whatever the estimates undercount (router/observe/tenants.py).
"""

from __future__ import annotations

import math


class TokenBucket:
    __slots__ = ("capacity", "level", "rate", "updated")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        if rate <= 0 or capacity <= 0:
            raise ValueError(f"a token bucket needs rate > 0 and capacity > 0, got {rate:g} and {capacity:g}")
        self.rate = rate
        self.capacity = capacity
        self.level = capacity  # a tenant starts with a full burst
        self.updated = now

    def refill(self, now: float) -> float:
        if now > self.updated:
            self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
            self.updated = now
        return self.level

    def take(self, now: float, units: float = 1.0) -> bool:
        """Take `units` if the bucket holds them; nothing is taken when it does not."""
        if self.refill(now) >= units:
            self.level -= units
            return True
        return False

    def charge(self, now: float, units: float) -> None:
        """Take `units` whether or not the bucket holds them (usage known after the fact): it may go negative."""
        self.refill(now)
        self.level -= units

    def credit(self, now: float, units: float) -> None:
        """Give back `units` charged before (a reservation larger than the use), never above capacity."""
        self.refill(now)
        self.level = min(self.capacity, self.level + units)

    def allows(self, now: float) -> bool:
        """Whether a charged bucket admits a request now (anything left above zero)."""
        return self.refill(now) > 0

    def wait_s(self, now: float, units: float = 0.0) -> float:
        """Seconds until the bucket holds more than `units` (0 when it already does)."""
        missing = units - self.refill(now)
        return 0.0 if missing < 0 else missing / self.rate + 1e-9


def retry_after_s(wait: float) -> int:
    """An HTTP Retry-After value: whole seconds (RFC 9110 §10.2.3 delay-seconds), at least 1."""
    return max(1, math.ceil(wait))
