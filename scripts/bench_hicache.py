#!/usr/bin/env python3
"""HiCache's host tier on simulated PD workers behind the inferctl router: a shared-prefix workload whose
system prompts exceed the prefills' HBM but fit HBM + host memory, with and without the tier.

`inferctl bench`'s shared-prefix workload (Zipf-popular tenants with long system prompts, short
questions) against 2 prefill + 2 decode simulated workers (Llama-3.1-70B on 8x H100 / H200, the
simulator's default preset) whose radix caches hold `--hbm-tokens` each: about a third of all tenants'
prompts. The "host tier" variant gives each prefill a host pool of `--ratio` x its HBM pool
(`--hicache-ratio`, write_through; host loads at 50 GB/s per GPU, sim/tiers.py), so every prompt fits
in HBM + host. Same seed, same workload, a fresh cluster per variant, all variants in the same run
(repeated `--repeat` times, interleaved). Hit rate = cached / prompt tokens as the prefills report them
(host hits included); TTFT in modelled seconds (wall / time_scale); `host` = tokens the prefills loaded
back from host memory (`sglang:load_back_tokens_total`).

    python scripts/bench_hicache.py [--requests 300] [--repeat 3] [--time-scale 1.0] [--json]

`--placement`: the router's placement on the tiered cluster instead (issue 16 item 5). Every prefill
has the host tier and publishes KV events (with `medium`: GPU, CPU_PINNED); the router routes on its
exact index three ways, same run: `device` (only HBM pages count: the router before tier weights),
`blind` (a page cached anywhere counts as one in HBM: weights all 1) and `aware` (host pages count
w_host, the load-time model's weight from the simulated model's KV bytes per token, prefill rate and
`--host-gbs`: core/routing/tiers.py). Device / host hit rate: cached tokens the prefills found in HBM /
loaded back from host, over prompt tokens.

    python scripts/bench_hicache.py --placement [--host-gbs 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infer_ctl.bench.client import LoadSpec
from infer_ctl.bench.run import run_bench
from infer_ctl.bench.stats import Slo
from infer_ctl.bench.workloads import WorkloadSpec
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.timing import preset


def kv_config() -> str:
    """SGLang's --kv-events-config on a free loopback port (and its replay port)."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{ports[0]}", "bind": True,
                       "replay_endpoint": f"tcp://127.0.0.1:{ports[1]}"})


def cluster(hbm_tokens: int, ratio: float | None, time_scale: float, *, kv_events: bool = False,
            host_gbs: float = 50.0) -> ThreadedSimCluster:
    common = {"time_scale": time_scale, "bootstrap_timeout_s": 60.0, "waiting_timeout_s": 60.0}
    specs = [WorkerSpec("prefill", cache_capacity_tokens=hbm_tokens, hicache_ratio=ratio, seed=i,
                        kv_events_config=kv_config() if kv_events else None, hicache_host_gb_s=host_gbs,
                        **common)  # type: ignore[arg-type]
             for i in range(2)]
    specs += [WorkerSpec("decode", seed=10 + i, **common) for i in range(2)]  # type: ignore[arg-type]
    return start_cluster_in_thread(specs)


@contextlib.contextmanager
def router(c: ThreadedSimCluster, **settings: Any) -> Iterator[str]:
    pre = [(w.url, w.bootstrap_port) for w in c.by_role("prefill")]
    dec = [w.url for w in c.by_role("decode")]
    handle = start_router_in_thread(router_config(prefill=pre, decode=dec, health_interval_s=1.0, **settings))
    try:
        if settings.get("tiers"):  # route on the exact index from the first request
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                docs = httpx.get(handle.url + "/admin/workers", timeout=5).json()["workers"]
                if all(d.get("index") == "exact" for d in docs if d.get("role") == "prefill"):
                    break
                time.sleep(0.2)
            else:
                raise SystemExit("the router's exact index did not come up")
        yield handle.url
    finally:
        handle.stop()


def host_loads(c: ThreadedSimCluster) -> int:
    total = 0
    for w in c.by_role("prefill"):
        text = httpx.get(w.url + "/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("sglang:load_back_tokens_total"):
                total += int(float(line.rsplit(" ", 1)[1]))
    return total


def run_variant(name: str, ratio: float | None, args: argparse.Namespace) -> dict[str, Any]:
    wl = WorkloadSpec(name="shared-prefix", requests=args.requests, seed=1, max_new_tokens=16, num_prefixes=24,
                      prefix_tokens=args.prefix_tokens, question_tokens=32, zipf_s=args.zipf)
    load = LoadSpec(concurrency=16, seed=1)
    c = cluster(args.hbm_tokens or 4 * args.prefix_tokens, ratio, args.time_scale)
    try:
        with router(c) as url:
            s = run_bench(url, wl, load, Slo(), time_scale=args.time_scale).summary
        loaded = host_loads(c)
    finally:
        c.stop()
    ttft = s["ttft_s"]
    return {"variant": name, "ok": s.get("ok", s.get("completed")), "failed": s.get("failed"),
            "hit_rate": s["cache_hit_rate"], "ttft_mean_s": ttft["mean"], "ttft_p50_s": ttft["p50"],
            "ttft_p99_s": ttft["p99"], "host_loaded_tokens": loaded}


def run_placement(name: str, tiers: str, args: argparse.Namespace) -> dict[str, Any]:
    wl = WorkloadSpec(name="shared-prefix", requests=args.requests, seed=1, max_new_tokens=16, num_prefixes=24,
                      prefix_tokens=args.prefix_tokens, question_tokens=32, zipf_s=args.zipf)
    load = LoadSpec(concurrency=16, seed=1)
    c = cluster(args.hbm_tokens or 4 * args.prefix_tokens, args.ratio, args.time_scale, kv_events=True,
                host_gbs=args.host_gbs)
    timing = c.by_role("prefill")[0].spec.timing()
    gpus = preset(c.by_role("prefill")[0].spec.preset).gpus
    # the router is told the simulated model's numbers (a real deployment: router.tiers in the profile)
    numbers = {"kv_bytes_per_token_per_rank": timing.kv_bytes_per_token // gpus,
               "prefill_tokens_per_s": timing.prefill_tokens_per_s, "host_gb_s": args.host_gbs}
    try:
        with router(c, tiers={"mode": tiers, **numbers}) as url:
            s = run_bench(url, wl, load, Slo(), time_scale=args.time_scale).summary
        loaded = host_loads(c)
    finally:
        c.stop()
    ttft, prompt = s["ttft_s"], max(1, s["prompt_tokens"])
    w = router_config(tiers={"mode": tiers, **numbers}).tier_weights()
    return {"variant": name, "w_host": None if w is None else round(w.host, 3),
            "ok": s.get("ok", s.get("completed")), "failed": s.get("failed"),
            "hit_rate": s["cache_hit_rate"], "device_hit_rate": (s["cached_tokens"] - loaded) / prompt,
            "host_hit_rate": loaded / prompt, "ttft_mean_s": ttft["mean"], "ttft_p50_s": ttft["p50"],
            "ttft_p99_s": ttft["p99"], "host_loaded_tokens": loaded}


def placement(args: argparse.Namespace) -> None:
    names = [("device", "device"), ("blind", "blind"), ("aware", "aware")]
    runs: list[dict[str, dict[str, Any]]] = []
    for i in range(args.repeat):
        order = names[i % 3:] + names[: i % 3]  # the host is shared: rotate which variant runs first
        runs.append({name: run_placement(name, tiers, args) for name, tiers in order})
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    print(f"{'run':>3} {'router':8} {'w_host':>6} {'hit rate':>9} {'device':>7} {'host':>7} {'TTFT mean':>10} "
          f"{'p50':>7} {'p99':>7} {'failed':>7}")
    for i, rows in enumerate(runs, 1):
        for name, _ in names:
            r = rows[name]
            w = "-" if r["w_host"] is None else f"{r['w_host']:.3f}"
            print(f"{i:>3} {name:8} {w:>6} {r['hit_rate']:9.1%} {r['device_hit_rate']:7.1%} {r['host_hit_rate']:7.1%} "
                  f"{r['ttft_mean_s']:10.3f} {r['ttft_p50_s']:7.3f} {r['ttft_p99_s']:7.3f} {r['failed']!s:>7}")
        a = rows["aware"]
        print("    aware vs " + ", vs ".join(
            f"{b}: mean TTFT {a['ttft_mean_s'] / rows[b]['ttft_mean_s']:.2f}x, device hit rate "
            f"{100 * (a['device_hit_rate'] - rows[b]['device_hit_rate']):+.1f} points" for b in ("blind", "device")))
    if len(runs) > 1:
        for b in ("blind", "device"):
            ratio = statistics.median(r["aware"]["ttft_mean_s"] / r[b]["ttft_mean_s"] for r in runs)
            print(f"median over {len(runs)} runs: aware / {b} mean TTFT {ratio:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--time-scale", type=float, default=3.0,
                    help="wall s per modelled s: above 1 the host's CPU time weighs less in the modelled TTFT")
    ap.add_argument("--prefix-tokens", type=int, default=3000, help="each tenant's system prompt (24 tenants)")
    ap.add_argument("--zipf", type=float, default=0.8, help="tenant popularity (Zipf exponent)")
    ap.add_argument("--hbm-tokens", type=int, default=None,
                    help="each prefill's HBM pool (default 4 x --prefix-tokens: a sixth of all tenants' prompts)")
    ap.add_argument("--ratio", type=float, default=3.0,
                    help="host pool / HBM pool of the tiered variant (default 3: HBM + host hold 16 prompts, the "
                    "~12 a prefill serves)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--placement", action="store_true",
                    help="compare the router's tier-aware, tier-blind and HBM-only placement on the tiered cluster")
    ap.add_argument("--host-gbs", type=float, default=50.0, help="host -> GPU GB/s per GPU of the simulated prefills")
    args = ap.parse_args()
    if args.placement:
        placement(args)
        return
    runs: list[list[dict[str, Any]]] = []
    for i in range(args.repeat):
        variants = [("HBM only", None), (f"HBM + host tier (ratio {args.ratio:g})", args.ratio)]
        if i % 2:
            variants.reverse()  # the host is shared: alternate which variant runs first
        rows = {name: run_variant(name, ratio, args) for name, ratio in variants}
        runs.append([rows[n] for n in sorted(rows, key=lambda n: n != "HBM only")])
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    print(f"{'run':>3} {'variant':34} {'hit rate':>9} {'TTFT mean':>10} {'TTFT p50':>9} {'TTFT p99':>9} "
          f"{'host tokens':>12} {'failed':>7}")
    for i, rows in enumerate(runs, 1):
        for r in rows:
            print(f"{i:>3} {r['variant']:34} {r['hit_rate']:9.1%} {r['ttft_mean_s']:10.3f} {r['ttft_p50_s']:9.3f} "
                  f"{r['ttft_p99_s']:9.3f} {r['host_loaded_tokens']:12,} {r['failed']!s:>7}")
        base, tier = rows
        print(f"    tier vs HBM only: hit rate {100 * (tier['hit_rate'] - base['hit_rate']):+.1f} points, "
              f"mean TTFT {tier['ttft_mean_s'] / base['ttft_mean_s']:.2f}x, p99 {tier['ttft_p99_s'] / base['ttft_p99_s']:.2f}x")
    if len(runs) > 1:
        gain = statistics.median(r[1]["hit_rate"] - r[0]["hit_rate"] for r in runs)
        ttft = statistics.median(r[1]["ttft_mean_s"] / r[0]["ttft_mean_s"] for r in runs)
        print(f"median over {len(runs)} runs: hit rate {100 * gain:+.1f} points, mean TTFT {ttft:.2f}x")


if __name__ == "__main__":
    main()
