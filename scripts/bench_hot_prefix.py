#!/usr/bin/env python3
"""Hot prefix on simulated PD workers: K-replica spread vs single-worker affinity vs sglang-router 0.3.2.

(Split out of the old bench_router_quality.py, whose cache-pressure scenario that script now runs
fairly, every part in its own process. This one still runs the cluster and the router in threads of
one process; sglang-router runs in PD mode, where 0.3.2's cache_aware picks prefills at random.)

Scenario `hot-prefix`: one system prompt carries most traffic at high concurrency, so the prefill that
holds it is the bottleneck. Compared: inferctl with the prompt registered as a named prefix on K=3
replicas (spread), inferctl with single-worker affinity (load guard off), sglang-router cache_aware.

Every variant gets a fresh simulated cluster (empty caches) with the same seed and workload.
Latencies are modelled seconds (wall / time_scale).

    python scripts/bench_hot_prefix.py [--requests 300] [--time-scale 0.2]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from servers import free_port, routes_ok, wait_ready

from infer_ctl.bench.client import LoadSpec
from infer_ctl.bench.run import run_bench
from infer_ctl.bench.stats import Slo
from infer_ctl.bench.workloads import WorkloadSpec, build
from infer_ctl.router.config import PrefixSpec
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

#: wall seconds per modelled second; higher = slower but less distorted by this host's CPU contention
SCALE = {"time_scale": 0.2}


def cluster(n_prefill: int, n_decode: int, capacity: int | None) -> ThreadedSimCluster:
    common = {"time_scale": SCALE["time_scale"], "bootstrap_timeout_s": 60.0, "waiting_timeout_s": 60.0}
    specs = [WorkerSpec("prefill", cache_capacity_tokens=capacity, seed=i, **common) for i in range(n_prefill)]
    specs += [WorkerSpec("decode", seed=10 + i, **common) for i in range(n_decode)]
    return start_cluster_in_thread(specs)


@contextlib.contextmanager
def inferctl(c: ThreadedSimCluster, **overrides: Any) -> Iterator[str]:
    pre = [(w.url, w.bootstrap_port) for w in c.by_role("prefill")]
    dec = [w.url for w in c.by_role("decode")]
    handle = start_router_in_thread(router_config(prefill=pre, decode=dec, health_interval_s=1.0, **overrides))
    try:
        yield handle.url
    finally:
        handle.stop()


@contextlib.contextmanager
def sglang_router(c: ThreadedSimCluster, policy: str = "cache_aware") -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation", "--policy", policy]
    for w in c.by_role("prefill"):
        cmd += ["--prefill", w.url, str(w.bootstrap_port)]
    for w in c.by_role("decode"):
        cmd += ["--decode", w.url]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(free_port()), "--log-level", "error"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    try:
        # ready when it routes, and it is the one started (scripts/servers.py); it was measured after 60 s
        # whether it answered or not
        wait_ready(url, proc, lambda: routes_ok(url), "sglang-router", timeout=60)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def run_variant(name: str, make_front: Callable[[ThreadedSimCluster], Any], n_prefill: int, n_decode: int,
                capacity: int | None, workload: WorkloadSpec, load: LoadSpec, settle_s: float = 0.0) -> dict[str, Any]:
    c = cluster(n_prefill, n_decode, capacity)
    try:
        with make_front(c) as url:
            time.sleep(settle_s)
            s = run_bench(url, workload, load, Slo(), time_scale=SCALE["time_scale"]).summary
    finally:
        c.stop()
    ttft = s["ttft_s"]
    return {"variant": name, "ok": s.get("ok", s.get("completed")), "hit_rate": s["cache_hit_rate"],
            "ttft_mean_s": ttft["mean"], "ttft_p50_s": ttft["p50"], "ttft_p99_s": ttft["p99"],
            "failed": s.get("failed")}


def hot_prefix(requests: int) -> list[dict[str, Any]]:
    # Each request still has ~1k uncached tokens to prefill after the shared prompt, and decodes are
    # short, so the prefill side is the bottleneck: where the hot prompt's traffic goes decides TTFT.
    wl = WorkloadSpec(name="shared-prefix", requests=requests, seed=2, max_new_tokens=4, num_prefixes=4,
                      prefix_tokens=2000, question_tokens=1000, zipf_s=3.0)
    reqs = build(wl)
    # The most frequent tenant's system prompt (~85 % of the traffic). Not simply the first request's:
    # the workload is shuffled, and registering a rarely used prompt would measure plain cache_aware.
    hot_tenant = collections.Counter(r.tenant for r in reqs).most_common(1)[0][0]
    hot = next(r.text for r in reqs if r.tenant == hot_tenant).split("\n\n")[0]
    load = LoadSpec(concurrency=32, seed=2)
    return [
        run_variant("inferctl named prefix K=3", lambda c: inferctl(c, prefixes=[PrefixSpec("hot", hot, replicas=3)],
                                                                  warm_via="pair"), 4, 4, None, wl, load, settle_s=3.0),
        run_variant("inferctl affinity only", lambda c: inferctl(c, balance_abs=10_000), 4, 4, None, wl, load),
        run_variant("sglang-router cache_aware", lambda c: sglang_router(c), 4, 4, None, wl, load),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    SCALE["time_scale"] = args.time_scale
    out: dict[str, list[dict[str, Any]]] = {}
    out["hot-prefix"] = hot_prefix(args.requests)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for scenario, rows in out.items():
        print(f"\n{scenario}")
        print(f"{'variant':30} {'hit rate':>9} {'TTFT mean':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'failed':>7}")
        for r in rows:
            print(f"{r['variant']:30} {r['hit_rate']:9.1%} {r['ttft_mean_s']:10.3f} {r['ttft_p50_s']:9.3f} "
                  f"{r['ttft_p99_s']:9.3f} {r['failed']!s:>7}")
        base = rows[0]
        for r in rows[1:]:
            print(f"  {base['variant']} vs {r['variant']}: hit rate {100 * (base['hit_rate'] - r['hit_rate']):+.1f} points, "
                  f"mean TTFT {base['ttft_mean_s'] / r['ttft_mean_s']:.2f}x, p99 TTFT {base['ttft_p99_s'] / r['ttft_p99_s']:.2f}x")


if __name__ == "__main__":
    main()
