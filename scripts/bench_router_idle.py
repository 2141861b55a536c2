#!/usr/bin/env python3
"""Idle CPU of `inferctl router serve --processes N` in front of simulated collocated workers with KV
events: the CPU seconds per second of the whole router process tree (its session) while no request
arrives. What an idle multi-process router costs the host (docs/benchmarks.md).

    python scripts/bench_router_idle.py [--processes 2] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from servers import free_port, get_ok, wait_ready


def session_cpu_s(sid: int) -> float:
    """User + system CPU seconds of the live processes of session `sid` (proc(5): fields 6, 14, 15)."""
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[3]) == sid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    dn = subprocess.DEVNULL
    workers, flags, urls = [], [], []
    for _ in range(args.workers):
        port = free_port()
        # a wildcard host: the publisher binds (SGLang's rule, sim/kv_config.py `should_bind`); with
        # 127.0.0.1 it would connect, as would the router's SUB, and both would retry ~10 times a second
        kv = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{free_port()}",
                         "replay_endpoint": f"tcp://*:{free_port()}"})
        workers.append(subprocess.Popen([sys.executable, "-m", "infer_ctl", "sim", "serve", "--worker",
                                         f"mixed@127.0.0.1:{port}", "--kv-events-config", kv], stdout=dn, stderr=dn))
        flags += ["--mixed", f"http://127.0.0.1:{port}"]
        urls.append(f"http://127.0.0.1:{port}")
    rport = free_port()
    router = subprocess.Popen([sys.executable, "-m", "infer_ctl", "router", "serve", "--listen",
                               f"127.0.0.1:{rport}", "--processes", str(args.processes), *flags],
                              start_new_session=True, stdout=dn, stderr=dn)
    try:
        # each server answering is the one started (scripts/servers.py): a foreign one on its port, or
        # a router that could not bind, would be measured as an idle router
        for url, proc in [*zip(urls, workers, strict=True), (f"http://127.0.0.1:{rport}", router)]:
            wait_ready(url, proc, lambda url=url: get_ok(url + "/health"), timeout=60)
        time.sleep(8)  # first health checks and subscriptions
        c0, t0 = session_cpu_s(router.pid), time.monotonic()
        time.sleep(args.seconds)
        c1, t1 = session_cpu_s(router.pid), time.monotonic()
        print(f"idle router CPU ({args.processes} processes): {1000 * (c1 - c0) / (t1 - t0):.1f} ms/s")
    finally:
        os.killpg(router.pid, signal.SIGTERM)
        router.wait()
        for w in workers:
            w.terminate()
            w.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
