"""Event-loop plumbing shared by everything that runs asyncio servers (router, simulator, bench)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import sys
import threading
import traceback
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


class LoopTimeout(TimeoutError):
    """A LoopThread call past its timeout; the message holds where the loop was (`LoopThread.where`)."""


class LoopThread:
    """An event loop running in a daemon thread, driven synchronously from the caller's thread: how the
    demo, tests and benchmarks host a router or simulated workers inside their own process."""

    def __init__(self, name: str, timeout: float = 30.0) -> None:
        self.loop = new_event_loop()
        self.timeout = timeout
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coro` on the loop and wait (at most `timeout`, else the thread's) for its result. Past
        it the call is cancelled and LoopTimeout says where the loop was: a hang reads as a stack."""
        wait = self.timeout if timeout is None else timeout
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(wait)
        except concurrent.futures.TimeoutError:
            where = self.where()
            fut.cancel()
            raise LoopTimeout(f"{self._thread.name}: no result within {wait:g}s\n{where}") from None

    def where(self, wait: float = 2.0) -> str:
        """What the loop is doing: its thread's stack, and every task's stack when the loop still runs
        callbacks (a loop that cannot answer within `wait` is blocked, by the call in its thread's stack)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        thread = "".join(traceback.format_stack(frame)) if frame is not None else "(thread gone)\n"
        tasks: concurrent.futures.Future[str] = concurrent.futures.Future()

        def dump() -> None:
            out = io.StringIO()
            for task in asyncio.all_tasks(self.loop):
                task.print_stack(limit=8, file=out)
            tasks.set_result(out.getvalue())

        try:
            self.loop.call_soon_threadsafe(dump)
            stacks = tasks.result(wait)
        except (RuntimeError, concurrent.futures.TimeoutError):
            stacks = f"(the loop did not run a callback within {wait:g}s: it is blocked)\n"
        return f"loop thread:\n{thread}tasks:\n{stacks}"

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
