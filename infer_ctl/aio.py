"""Event-loop plumbing shared by everything that runs asyncio servers (router, simulator, bench)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop when available (it is the faster loop), else the standard one."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a default dependency off Windows
        return asyncio.new_event_loop()


class LoopThread:
    """An event loop running in a daemon thread, driven synchronously from the caller's thread: how the
    demo, tests and benchmarks host a router or simulated workers inside their own process."""

    def __init__(self, name: str, timeout: float = 30.0) -> None:
        self.loop = new_event_loop()
        self.timeout = timeout
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait (at most `timeout`) for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(self.timeout)

    @property
    def closed(self) -> bool:
        return self.loop.is_closed()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()
