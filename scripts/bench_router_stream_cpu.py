#!/usr/bin/env python3
"""CPU per streamed request of the router (this checkout's, and a --baseline checkout's in the same
repetitions): one collocated stand-in worker streaming 16 SSE events and `data: [DONE]` per request,
wrk opening a new connection per request (`Connection: close`, as bench_router_quality's load generator
does), the router at one process. What the relay, the upstream keep-alive and the socket writes of a
streamed request cost, without the KV events, anchoring and simulated compute of the cache-pressure
benchmark around them.

    python scripts/bench_router_stream_cpu.py [--baseline CHECKOUT] [--pace-ms 2] [--repeat 4] [--duration 6]

`--pace-ms`: the stand-in sleeps that long between events (each event then arrives and is relayed on its
own, as tokens do; 0: the events arrive together and the relay may take several in one read). CPU is the
router process's user + system time from /proc over each wrk run, divided by the requests answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_router_overhead import cpu_seconds, wait_http
from servers import free_port, stop_all


def standin(port: int, pace_s: float) -> None:
    import uvloop
    from aiohttp import web

    events = [b"data: " + json.dumps({"text": "w" * (i + 1), "meta_info": {
        "id": "x", "prompt_tokens": 300, "completion_tokens": i + 1, "cached_tokens": 0,
        "finish_reason": None}}).encode() + b"\n\n" for i in range(16)]
    info = {"status": "ok", "loads": [{"num_waiting_reqs": 0, "num_running_reqs": 0}]}

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
            if pace_s:
                await asyncio.sleep(pace_s)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response(info)

    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    app = web.Application()
    app.router.add_post("/generate", generate)
    for path in ("/health", "/server_info", "/get_server_info", "/v1/loads", "/get_model_info", "/model_info",
                 "/v1/models"):
        app.router.add_get(path, ok)
    uvloop.install()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--standin", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT")
    ap.add_argument("--pace-ms", type=float, default=0.0)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--duration", type=int, default=6)
    ap.add_argument("--connections", type=int, default=8)
    args = ap.parse_args()
    if args.standin:
        standin(args.standin, args.pace_ms / 1000)
        return
    here = Path(__file__).resolve().parent.parent
    checkouts = [here] + ([args.baseline.resolve()] if args.baseline else [])
    sp = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--standin", str(sp), "--pace-ms", str(args.pace_ms)])]
    tmp = Path(tempfile.mkdtemp())
    lua = tmp / "stream.lua"
    body = json.dumps({"text": "abc " * 300, "stream": True, "sampling_params": {"max_new_tokens": 16}})
    lua.write_text('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                   f'wrk.headers["Connection"] = "close"\nwrk.body = \'{body}\'\n')
    try:
        wait_http(f"http://127.0.0.1:{sp}/health", procs[0])
        routers = {}
        for co in checkouts:
            port = free_port()
            routers[co] = (f"http://127.0.0.1:{port}", subprocess.Popen(
                [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}",
                 "--mixed", f"http://127.0.0.1:{sp}", "--log-level", "warning", "--processes", "1"],
                cwd=co, env={**os.environ, "INFERCTL_ROUTER_TOKEN": "", "PYTHONPATH": str(co)},
                stderr=subprocess.DEVNULL))
            procs.append(routers[co][1])
        for url, proc in routers.values():
            wait_http(url + "/health", proc)
            subprocess.run(["wrk", "-t1", "-c4", "-d2s", "-s", str(lua), url + "/generate"], capture_output=True)
        load_before = os.getloadavg()
        res: dict[Path, list[float]] = {co: [] for co in checkouts}
        for rep in range(args.repeat):
            for co in checkouts if rep % 2 == 0 else checkouts[::-1]:
                url, p = routers[co]
                c0 = cpu_seconds(p.pid)
                out = subprocess.run(["wrk", "-t2", f"-c{args.connections}", f"-d{args.duration}s", "-s", str(lua),
                                      url + "/generate"], capture_output=True, text=True, check=True).stdout
                n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
                errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
                if errors:
                    raise SystemExit(f"{co}: {errors.group(1)} requests failed")
                res[co].append((cpu_seconds(p.pid) - c0) / n * 1e6)
        print(f"pace {args.pace_ms:g} ms, {args.repeat} x {args.duration} s, load average before "
              f"{[round(x, 2) for x in load_before]}, after {[round(x, 2) for x in os.getloadavg()]}")
        for co in checkouts:
            print(f"{co!s:40} CPU us per streamed request: median {statistics.median(res[co]):.0f} "
                  f"({', '.join(f'{x:.0f}' for x in res[co])})")
        if args.baseline:
            ratios = [a / b for a, b in zip(res[here], res[checkouts[1]], strict=True)]
            print(f"this checkout / baseline: median {statistics.median(ratios):.3f}x "
                  f"({', '.join(f'{x:.3f}' for x in ratios)})")
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
