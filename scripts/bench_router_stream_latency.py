#!/usr/bin/env python3
"""What a router adds to a streamed request's time to first token, one request at a time.

One simulated collocated worker (`inferctl sim serve`, time scale 1, KV events on, a cache large enough
for the run), and in front of it `inferctl router serve` and the peer (smg 1.13.0, SGLang's current
gateway, by default; sglang-router 0.3.2 with --peer sglang-router), regular mode, the same policy; the load generator is this script. Every request is a 1,200-word shared system prompt plus
its own 48-word question, streamed, 4 output tokens, on a new client connection (no kept-alive
connection can hold a chunk: docs/benchmarks.md, TTFT), and the three targets are called in turn for
each request, so all three see the same machine. Each target gets its own question (the worker
computes it for each), the system prompt is cached for all. Added = the target's median TTFT minus the
worker's own (called directly) in the same run.

    python scripts/bench_router_stream_latency.py [--requests 80] [--policy cache_aware|round_robin]
                                                  [--processes N] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from servers import free_port, get_ok, routes_ok, stop_all, wait_ready

ROOT = Path(__file__).resolve().parent.parent


def ttft_ms(url: str, body: dict[str, object]) -> float:
    """Time to the first body byte of a streamed answer, on a connection of its own."""
    with httpx.Client(timeout=30) as c:
        t = time.perf_counter()
        first = None
        with c.stream("POST", url + "/generate", json=body) as r:
            r.raise_for_status()
            for chunk in r.iter_raw():
                if chunk and first is None:
                    first = time.perf_counter()
        if first is None:
            raise RuntimeError(f"{url}: the stream carried no data")
        return (first - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=80)
    ap.add_argument("--policy", default="cache_aware", choices=["cache_aware", "round_robin"])
    ap.add_argument("--processes", type=int, default=None, help="router serve --processes (default: its own)")
    ap.add_argument("--peer", choices=["smg", "sglang-router"], default="smg")
    ap.add_argument("--router-arg", action="append", default=[], metavar="ARG",
                    help="an extra `router serve` argument (repeatable), e.g. --router-arg=--no-kv-events")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFERCTL_ROUTER_TOKEN": ""}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        wp, kp, rp = free_port(), free_port(), free_port()
        kv = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{kp}", "replay_endpoint": f"tcp://*:{rp}"})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "infer_ctl", "sim", "serve", "--worker", f"mixed@127.0.0.1:{wp}", "--seed", "1",
             "--time-scale", "1", "--no-spec", "--cache-tokens", "200000", "--kv-events-config", kv],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        worker = f"http://127.0.0.1:{wp}"
        wait_ready(worker, procs[0], lambda: get_ok(worker + "/health"), timeout=60)
        ip, sp = free_port(), free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{ip}", "--mixed", worker,
             "--policy", args.policy, "--log-level", "warning"]
            + (["--processes", str(args.processes)] if args.processes else []) + args.router_arg,
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        peer = "smg 1.13.0" if args.peer == "smg" else "sglang-router 0.3.2"
        peer_cmd = ([shutil.which("smg") or "smg", "launch"] if args.peer == "smg"
                    else [sys.executable, "-m", "sglang_router.launch_router"])
        peer_log = tempfile.NamedTemporaryFile(prefix="peer-", suffix=".log", delete=False)  # noqa: SIM115
        procs.append(subprocess.Popen(
            [*peer_cmd, "--worker-urls", worker, "--policy", args.policy,
             "--host", "127.0.0.1", "--port", str(sp), "--prometheus-port", str(free_port()),
             "--log-level", "warn" if args.peer == "smg" else "warning"],
            stdout=peer_log, stderr=subprocess.STDOUT))
        targets = {"direct (the worker)": worker, "inferctl router": f"http://127.0.0.1:{ip}", peer: f"http://127.0.0.1:{sp}"}
        for url, proc in ((targets["inferctl router"], procs[1]), (targets[peer], procs[2])):
            wait_ready(url, proc, functools.partial(routes_ok, url), timeout=60)
        rng = random.Random(1)
        words = ["".join(rng.choice("abcdefghij") for _ in range(3)) for _ in range(1200)]
        system = " ".join(words)

        def body(i: int) -> dict[str, object]:
            question = " ".join(rng.choice(words) for _ in range(48))
            return {"text": f"{system} question {i} {question}", "stream": True, "sampling_params": {"max_new_tokens": 4}}

        time.sleep(2)  # both routers' first health rounds done
        for url in targets.values():  # the system prompt computed and cached, each router's first sight paid
            ttft_ms(url, body(-1))
        runs: dict[str, list[float]] = {name: [] for name in targets}
        load = os.getloadavg()
        for i in range(args.requests):
            for name, url in targets.items():
                runs[name].append(ttft_ms(url, body(i)))
        direct = statistics.median(runs["direct (the worker)"])
        doc = {"policy": args.policy, "requests": args.requests, "load_average_before": [round(x, 2) for x in load],
               "load_average_after": [round(x, 2) for x in os.getloadavg()],
               "rows": [{"target": name, "p50_ms": round(statistics.median(v), 3), "mean_ms": round(statistics.mean(v), 3),
                         "added_p50_ms": round(statistics.median(v) - direct, 3)} for name, v in runs.items()]}
        # the peer's own log, read: a peer that misbehaves is found out before its figure is reported
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in Path(peer_log.name).read_text(errors="replace").splitlines()]
        doc["peer_log_warnings"] = [ln[:300] for ln in lines if re.search(r"WARN|ERROR", ln)][:10]
        if args.json:
            print(json.dumps(doc, indent=2))
            return
        print(f"{peer} log warnings/errors: {doc['peer_log_warnings'] or 'none'}")
        print(f"{args.requests} streamed requests per target, policy {args.policy}, load {doc['load_average_before']}"
              f" -> {doc['load_average_after']}")
        for row in doc["rows"]:
            print(f"{row['target']:22} p50 {row['p50_ms']:7.2f} ms  mean {row['mean_ms']:7.2f} ms  "
                  f"added p50 {row['added_p50_ms']:5.2f} ms")
    finally:
        stop_all(procs)  # the last started first: the routers before the worker they call


if __name__ == "__main__":
    main()
