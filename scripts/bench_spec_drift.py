#!/usr/bin/env python3
"""The spec-drift scenario (`inferctl demo --scenario spec-drift`, control act) repeated: throughput before
and after the controller relaunched the drifted pool, in the same run, and what the router's speculative
accounting costs per answer.

    python scripts/bench_spec_drift.py [--repeat 5] [--requests 96] [--time-scale 0.25] [--json]
    python scripts/bench_spec_drift.py --overhead [--n 200000]

Per repetition (a fresh simulated cluster each time): model-time throughput of the cluster and of the
drifted decode (dc-02) in the window before the change and the window after it, both of steady closed-loop
non-streaming traffic of the same (creative) workload; tokens per target-step time of dc-02 (accept length
/ (1 + steps x c): from the router's counts, so CPU contention cannot move it); requests failed during the
relaunch and in the whole run. The table shows every repetition and the medians. Wall-clock throughput on a
shared 2-core machine is noisy (other processes stretch the simulator's time); the medians over
repetitions and the count-based figure are the results.

`--overhead`: microseconds per answer of `SpecStats.answered` (the router's hook on every finished
response), for an answer with SGLang's speculative fields and one without.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def overhead(n: int) -> dict[str, float]:
    from infer_ctl.profile.router import RouterSettings
    from infer_ctl.profile.speculative import SpeculativeSettings
    from infer_ctl.router.observe.spec_stats import SpecStats

    stats = SpecStats(window=SpeculativeSettings().window_requests, max_labels=RouterSettings().spec_max_labels)
    meta = {"id": "a", "finish_reason": {"type": "length", "length": 64}, "prompt_tokens": 900,
            "completion_tokens": 64, "cached_tokens": 800, "e2e_latency": 1.2}
    spec = {"text": "x" * 100, "meta_info": {**meta, "spec_accept_rate": 0.65, "spec_accept_length": 2.9,
                                             "spec_num_correct_drafts": 43, "spec_num_proposed_drafts": 66,
                                             "spec_verify_ct": 22, "spec_correct_drafts_histogram": [5, 6, 5, 6]}}
    plain = {"text": "x" * 100, "meta_info": meta}
    body = {"text": "hi", "custom_labels": {"domain": "code"}}
    out = {}
    for name, obj in (("with_spec_fields", spec), ("without", plain)):
        t = timeit.timeit(lambda o=obj: stats.answered("http://d", body, {}, None, o), number=n)
        out[name] = t / n * 1e6
    return out


def run(repeat: int, requests: int, time_scale: float) -> list[dict[str, Any]]:
    from infer_ctl.bench.spec_demo import SpecDemoOptions, run_spec_demo
    from infer_ctl.profile import load_profile

    rows = []
    for i in range(repeat):
        o = run_spec_demo(load_profile("builtin:local"),
                          SpecDemoOptions(control="act", seed=i, requests=requests, time_scale=time_scale))
        before, after = o.phases[1], o.phases[2]
        d2 = next(u for u, p in o.decodes.items() if p == "dc-02")
        rows.append({
            "cluster_before": before.throughput, "cluster_after": after.throughput,
            "dc02_before": before.per_decode[d2], "dc02_after": after.per_decode[d2],
            "dc02_step_before": before.step_throughput[d2], "dc02_step_after": after.step_throughput[d2],
            "failed_during_change": o.failed_during_change, "ok_during_change": o.ok_during_change,
            "failed_total": o.failed_total,
            "changes": [(a["pool"], a["from_steps"], a["num_steps"]) for a in o.actions if a["action"] == "relaunch"],
        })
        r = rows[-1]
        print(f"rep {i + 1}: cluster {r['cluster_before']:,.0f} -> {r['cluster_after']:,.0f} tok/s "
              f"({r['cluster_after'] / r['cluster_before']:.2f}x); dc-02 {r['dc02_before']:,.0f} -> "
              f"{r['dc02_after']:,.0f} tok/s, {r['dc02_step_before']:.3f} -> {r['dc02_step_after']:.3f} tok/target "
              f"step; failed {r['failed_during_change']}/{r['ok_during_change'] + r['failed_during_change']} during "
              f"the change, {r['failed_total']} in all; {r['changes']}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--time-scale", type=float, default=0.25)
    ap.add_argument("--overhead", action="store_true")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    if args.overhead:
        doc: dict[str, Any] = {"us_per_answer": overhead(args.n)}
    else:
        rows = run(args.repeat, args.requests, args.time_scale)
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "changes"}
        doc = {"repetitions": rows, "median": med,
               "median_ratio": {"cluster": statistics.median(r["cluster_after"] / r["cluster_before"] for r in rows),
                                "dc02": statistics.median(r["dc02_after"] / r["dc02_before"] for r in rows),
                                "dc02_step": statistics.median(r["dc02_step_after"] / r["dc02_step_before"]
                                                               for r in rows)}}
    doc["load_average"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(doc, indent=1) if args.json else json.dumps({k: v for k, v in doc.items() if k != "repetitions"},
                                                                  indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
