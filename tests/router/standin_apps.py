"""Scripted aiohttp stand-in workers on loopback, one per behaviour name, served from an event loop in a
thread of their own: for stream and failure tests whose faults the simulator cannot produce on demand."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from aiohttp import web


@contextlib.contextmanager
def serve_apps(make_app: Callable[[str, dict[str, Any]], web.Application],
               names: Iterable[str]) -> Iterator[dict[str, tuple[str, dict[str, Any]]]]:
    """`{name: (url, calls)}`: `make_app(name, calls)` served on a free port each; `calls` is the dict the
    app counts in (starts as {"n": 0})."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    async def start(name: str) -> tuple[str, dict[str, Any]]:
        calls: dict[str, Any] = {"n": 0}
        runner = web.AppRunner(make_app(name, calls))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", calls  # type: ignore[union-attr]

    try:
        yield {n: asyncio.run_coroutine_threadsafe(start(n), loop).result(10) for n in names}
    finally:
        for r in runners:
            asyncio.run_coroutine_threadsafe(r.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
