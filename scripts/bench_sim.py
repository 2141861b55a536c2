#!/usr/bin/env python3
"""Simulator overhead: how many requests/s one simulated worker sustains on one CPU core.

The worker runs in its own process pinned to core 0 with a negligible time scale (1e-6: the modelled
GPU time is ~0), so what is measured is the simulator's own CPU cost per request (HTTP, tokenizing,
radix cache, scheduler, SSE). The peer, measured in the same run on the same core, is a bare aiohttp
handler returning a fixed JSON body: the floor of the HTTP stack. The client runs on core 1.

    python scripts/bench_sim.py [--seconds 5] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import time

import aiohttp

PROMPT = "You are a helpful assistant. " * 40 + "Question: what is the capital of France?"


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > core:
        os.sched_setaffinity(0, {core})


def _serve_sim(port_q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    _pin(0)
    from infer_ctl.aio import new_event_loop
    from infer_ctl.sim.config import WorkerSpec
    from infer_ctl.sim.server import SimWorker

    async def main() -> None:
        w = SimWorker(WorkerSpec("mixed", time_scale=1e-6))
        await w.start()
        port_q.put(w.port)
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await w.stop()

    new_event_loop().run_until_complete(main())


def _serve_floor(port_q: mp.Queue, stop: mp.Event) -> None:  # type: ignore[type-arg]
    _pin(0)
    from aiohttp import web

    from infer_ctl.aio import new_event_loop

    body = {"text": "x", "output_ids": [1], "meta_info": {"completion_tokens": 1}}

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(body)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/generate", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await runner.cleanup()

    new_event_loop().run_until_complete(main())


async def _load(url: str, seconds: float, concurrency: int, body: dict) -> tuple[int, int]:
    done = errors = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def worker() -> None:
            nonlocal done, errors
            while time.monotonic() < deadline:
                async with s.post(url, json=body) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, errors


def measure(target, seconds: float, concurrency: int, body: dict) -> float:  # type: ignore[no-untyped-def]
    q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    stop = mp.Event()
    p = mp.Process(target=target, args=(q, stop), daemon=True)
    p.start()
    port = q.get(timeout=30)
    _pin(1)
    url = f"http://127.0.0.1:{port}/generate"
    asyncio.run(_load(url, 0.5, concurrency, body))  # warm-up
    done, errors = asyncio.run(_load(url, seconds, concurrency, body))
    stop.set()
    p.join(10)
    if errors:
        raise SystemExit(f"{errors} requests failed")
    return done / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=64)
    args = ap.parse_args()
    rows = {}
    for tokens in (1, 16):
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": tokens}}
        rows[f"sim worker, non-stream, {tokens} output tokens"] = measure(_serve_sim, args.seconds, args.concurrency, body)
    stream = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 16}}
    rows["sim worker, stream, 16 output tokens"] = measure(_serve_sim, args.seconds, args.concurrency, stream)
    floor = measure(_serve_floor, args.seconds, args.concurrency, {"text": PROMPT})
    rows["peer: bare aiohttp JSON handler"] = floor
    print(f"{'case':<48} {'req/s':>8} {'vs floor':>9}")
    for name, rps in rows.items():
        print(f"{name:<48} {rps:>8.0f} {rps / floor:>8.2f}x")
    print(json.dumps({k: round(v, 1) for k, v in rows.items()}))


if __name__ == "__main__":
    main()
