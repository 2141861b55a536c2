"""Admission: whether a request may start now. Refused while draining (503); at most `max_concurrent`
run at once and at most `max_queue` wait for a slot, each for at most `queue_timeout_s` (429 beyond
either). The router-wide "may it start" rules; a tenant's own limits (key, rate, tokens, concurrency)
are checked before these, by tenants.py through the request's observer (observe.py)."""

from __future__ import annotations

import asyncio
from typing import NamedTuple


class Refusal(NamedTuple):
    """Why a request was not admitted: its HTTP answer and the `rejected_total` reason label."""

    status: int
    message: str
    reason: str


DRAINING = Refusal(503, "router is shutting down; retry on another router", "draining")
OVERLOADED = Refusal(429, "too many concurrent requests; retry later", "overloaded")
QUEUE_TIMEOUT = Refusal(429, "queued too long waiting for a slot; retry later", "queue_timeout")


class Admission:
    def __init__(self, max_concurrent: int, max_queue: int, queue_timeout_s: float) -> None:
        self.slots = asyncio.Semaphore(max_concurrent)
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        #: requests holding a slot, and requests waiting for one
        self.active = 0
        self.waiting = 0
        self.draining = False

    async def enter(self) -> Refusal | None:
        """Take a slot (waiting in the queue when none is free); None when admitted. Every admitted
        request calls `leave()` exactly once."""
        if self.draining:
            return DRAINING
        if self.slots.locked():
            if self.waiting >= self.max_queue:
                return OVERLOADED
            self.waiting += 1
            try:
                await asyncio.wait_for(self.slots.acquire(), self.queue_timeout_s)
            except TimeoutError:
                return QUEUE_TIMEOUT
            finally:
                self.waiting -= 1
        else:
            await self.slots.acquire()
        self.active += 1
        return None

    def leave(self) -> None:
        self.active -= 1
        self.slots.release()
