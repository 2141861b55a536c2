"""Work for the event loop's next turn, scheduled once however often it is asked for in this one.

A routing decision's bookkeeping (picker.py) and a flight's entry into the coalescing overlay (coalesce.py)
run after the upstream writes that follow their request's decision in the same turn: off its time to first
token. Readers of the deferred state apply it first (core/routing/index.py `insert_later`,
core/routing/coalesce.py `PendingBlocks.add_later`), so the deferral is never visible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class NextTurn:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        #: the loop whose next turn runs `fn`; None: not scheduled. A loop stopped before that turn is
        #: not waited for: the next `soon` on another loop schedules again
        self._loop: asyncio.AbstractEventLoop | None = None

    def soon(self) -> bool:
        """Schedule `fn` for the running loop's next turn (once per turn). False without a running loop
        (the caller runs it now)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self._loop is not loop:
            loop.call_soon(self.run)
            self._loop = loop
        return True

    def run(self) -> None:
        """`fn` now; a later `soon` schedules it again."""
        self._loop = None
        self.fn()
