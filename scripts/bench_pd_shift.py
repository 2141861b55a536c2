#!/usr/bin/env python3
"""Issue 30's "Done when" numbers for the PD balance controller, on the simulator (docs/benchmarks.md).

shift: the pd-shift workload (infer_ctl/bench/pd_demo.py) with the controller acting and with the static
2:2 split, RUNS times each, alternating; goodput (requests meeting TTFT and ITL objectives per second) over
the shifted phase, its ratio per pair of runs and the median; when the switch was done after the shift;
failed requests. The switch after the shift is the first switch toward decode done after it (a switch
toward prefill in the long-prompt phase is listed under `switches`, not counted as it). `pace`: the
model's ITL over the measured one (docs/benchmarks.md: under ~0.8 the run measures the CPU, not the split).

kill: 2P+2D with role switching, closed-loop non-streaming requests; one of the two decodes is stopped
(in-process: its server closes every connection, what kill -9 looks like from the router); the seconds
until the controller's cover switch is done (a prefill serving as a decode), and failed requests; the
dead decode comes back at RELAUNCH_S (the static fleet's capacity is short until then) and the cover is
given back.

    PYTHONPATH=$PWD python scripts/bench_pd_shift.py [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import threading
import time
from typing import Any

import httpx

from infer_ctl.bench.pd_demo import PdShiftOptions, run_pd_shift
from infer_ctl.launch.pd_control import PdControlLoop
from infer_ctl.launch.pd_switch import RoleSwitcher
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.router.control.client import AdminClient
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.timing import resolve_timing

RELAUNCH_S = 8.0
#: a pair whose arms both ran at this share of model speed or more measured the split, not the CPU
MIN_PACE = 0.8


def shift(runs: int, time_scale: float = 0.1) -> dict[str, Any]:
    """`time_scale` above the demo's 0.1 runs the same model-time scenario slower in wall time (phases and
    wall-second objectives stretched alike): less CPU per wall second, for a machine the simulator shares."""
    k = time_scale / 0.1
    # the model's ITL in wall seconds (a full batch of 6 short prompts half way through 200 tokens): `pace` is
    # it over the measured phase-2 ITL median, 1.0 where the simulator keeps model time; well under 1 the one
    # process that runs servers, router and clients is short of CPU, and its token rate, not the decode
    # pool's batch slots, bounds the phase's goodput (then a third decode adds steps, not tokens)
    model_itl = resolve_timing("h100-llama-3.1-70b", "decode", speculative=False,
                               max_running_requests=6).decode_step_seconds(6, 6 * 200) * time_scale
    rows = []
    for i in range(runs):
        pair = {}
        for control in ("act", "off"):
            opts = PdShiftOptions(control=control, seed=i, phase1_s=4.0 * k, phase2_s=12.0 * k, phase2_max_s=12.0 * k,
                                  time_scale=time_scale, ttft_slo_s=1.5 * k, itl_slo_s=0.05 * k)
            s = run_pd_shift(opts).summary(opts)
            p2 = s["phase2"]
            pair[control] = {"goodput_rps": p2["goodput_rps"], "failed": s["failed"],
                             "switch_after_shift_s": s.get("switch_after_shift_s"),
                             "switches": s["switches"], "requests": p2["requests"], "missed": p2["missed"],
                             "ttft_median_s": p2["ttft_median_s"], "itl_median_s": p2["itl_median_s"],
                             "pace": round(model_itl / p2["itl_median_s"], 2) if p2["itl_median_s"] else None}
        pair["ratio"] = round(pair["act"]["goodput_rps"] / pair["off"]["goodput_rps"], 2) \
            if pair["off"]["goodput_rps"] else None
        paces = [pair[c]["pace"] for c in ("act", "off")]
        pair["at_pace"] = all(p is not None and p >= MIN_PACE for p in paces)
        print(json.dumps(pair), flush=True)
        rows.append(pair)
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    switches = [r["act"]["switch_after_shift_s"] for r in rows if r["act"]["switch_after_shift_s"] is not None]
    return {"runs": rows, "model_itl_s": round(model_itl, 5), "median_ratio": statistics.median(ratios) if ratios else None,
            "median_switch_after_shift_s": statistics.median(switches) if switches else None,
            "switched_runs": len(switches), "pairs_at_pace": sum(r["at_pace"] for r in rows),
            "failed": sum(r["act"]["failed"] + r["off"]["failed"] for r in rows)}


def kill(seed: int) -> dict[str, Any]:
    base: dict[str, Any] = {"time_scale": 0.1, "speculative": False, "enable_pd_role_switch": True,
                            "preset": "h100-llama-3.1-70b", "bootstrap_timeout_s": 30.0, "waiting_timeout_s": 30.0}
    c = start_cluster_in_thread([WorkerSpec("prefill", seed=seed, **base), WorkerSpec("prefill", seed=seed + 1, **base),
                                 WorkerSpec("decode", seed=seed + 2, **base), WorkerSpec("decode", seed=seed + 3, **base)])
    prof = validate_profile_data({
        "name": "pd-kill", "models": {"target": {"path": "/m/t", "tp": 8}}, "router": {"listen": "127.0.0.1:0", "health_interval_s": 0.2},
        "nodes": [{"name": "p", "host": "127.0.0.1", "roles": ["prefill"]},
                  {"name": "d", "host": "127.0.0.2", "roles": ["decode"]}],
        "sglang": {"pd_role_switch": True},
        "pd": {"control": "act", "ttft_slo_s": 5.0, "itl_slo_s": 0.5, "min_requests": 1, "stale_s": 2.0,
               "sustain_s": 60, "cooldown_s": 1, "drain_timeout_s": 10, "decode_cuda_graph_memory_gb": 4.0}})
    out: dict[str, Any] = {}
    try:
        cfg = router_config(prefill=[(c.urls[i], c.workers[i].bootstrap_port) for i in range(2)], decode=c.urls[2:],
                            health_interval_s=0.2)
        with start_router_in_thread(cfg) as h:
            client = AdminClient(h.url, timeout=30)
            loop = PdControlLoop(prof, router_url=h.url, mode="act", client=client,
                                 switcher=RoleSwitcher(client, decode_cuda_graph_memory_gb=4.0, drain_timeout_s=10))
            stop = threading.Event()
            events: list[tuple[float, dict[str, Any]]] = []
            t0 = time.monotonic()
            ctl = threading.Thread(target=loop.run, args=(0.25,), daemon=True,
                                   kwargs={"stop": stop.is_set,
                                           "on_records": lambda rs: events.extend((time.monotonic() - t0, r) for r in rs)})
            ctl.start()
            answers: list[int] = []

            async def client_loop(cl: httpx.AsyncClient, end: float) -> None:
                while time.monotonic() - t0 < end:
                    try:
                        r = await cl.post(h.url + "/generate", json={"text": "kill test " * 20,
                                                                    "sampling_params": {"max_new_tokens": 64}})
                        answers.append(r.status_code)
                    except httpx.HTTPError:
                        answers.append(0)

            async def scenario() -> None:
                async with httpx.AsyncClient(timeout=120) as cl:
                    async def chaos() -> None:
                        await asyncio.sleep(3.0)
                        out["kill_at_s"] = time.monotonic() - t0
                        await asyncio.to_thread(c.stop_worker, 3)
                        await asyncio.sleep(RELAUNCH_S)
                        await asyncio.to_thread(c.start_worker, 3)
                        out["relaunch_at_s"] = time.monotonic() - t0
                    await asyncio.gather(chaos(), *(client_loop(cl, 3.0 + RELAUNCH_S + 5.0) for _ in range(8)))
            asyncio.run(scenario())
            stop.set()
            ctl.join(30)
        covers = [t for t, r in events if r["action"] == "cover" and r.get("result", {}).get("ok")]
        restores = [t for t, r in events if r["action"] == "restore" and r.get("result", {}).get("ok")]
        out["capacity_restored_after_kill_s"] = round(covers[0] - out["kill_at_s"], 2) if covers else None
        out["static_capacity_back_after_kill_s"] = round(out["relaunch_at_s"] - out["kill_at_s"], 2)
        out["cover_given_back_after_relaunch_s"] = round(restores[0] - out["relaunch_at_s"], 2) if restores else None
        out["requests"] = len(answers)
        out["failed_non_streaming"] = sum(a != 200 for a in answers)
        out["actions"] = [r["action"] for _, r in events]
    finally:
        c.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--only", choices=("shift", "kill"))
    ap.add_argument("--time-scale", type=float, default=0.1, help="shift: wall s per model s (0.1: the demo's)")
    a = ap.parse_args()
    logging.getLogger("infer_ctl.router").setLevel(logging.ERROR)
    res: dict[str, Any] = {}
    if a.only in (None, "shift"):
        res["shift"] = shift(a.runs, a.time_scale)
    if a.only in (None, "kill"):
        kills = [kill(i) for i in range(a.runs)]
        for k in kills:
            print(json.dumps(k), flush=True)
        restored = [k["capacity_restored_after_kill_s"] for k in kills if k["capacity_restored_after_kill_s"] is not None]
        res["kill"] = {"runs": kills, "median_capacity_restored_s": statistics.median(restored) if restored else None,
                       "failed_non_streaming": sum(k["failed_non_streaming"] for k in kills)}
    summary = {k: {kk: vv for kk, vv in v.items() if kk != "runs"} for k, v in res.items()}
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
