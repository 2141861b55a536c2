"""Foreground serving for `inferctl router serve`: uvloop, signals, drain on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from infer_ctl.aio import new_event_loop
from infer_ctl.router.config import RouterConfig
from infer_ctl.router.daemon.assembly import build
from infer_ctl.router.observe.logs import setup_logging
from infer_ctl.router.scaleout.follow import ProcessRole


async def _main(cfg: RouterConfig, proc: ProcessRole | None = None) -> int:
    server = build(cfg, proc)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # Everything built so far (modules, the assembly, tokenizers) lives as long as the process: out of
    # the collector's sight, a full collection walks only what requests and KV events allocate since
    # (it walked the whole start-up heap, tens of ms, now and then in the middle of a request)
    gc.freeze()
    await stop.wait()
    await server.stop(drain=True)
    return 0


def serve_forever(cfg: RouterConfig, log_level: str = "info", proc: ProcessRole | None = None,
                  handler: logging.Handler | None = None) -> int:
    """`proc`: one of several router processes (router/daemon/procs.py), whose logging is set up already."""
    if handler is None:
        setup_logging(log_level)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_main(cfg, proc))
    finally:
        loop.close()
