"""One bench run end to end: build the workload, detect the time scale, send it, summarize."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from infer_ctl.bench.client import LoadSpec, detect_time_scale, run_load
from infer_ctl.bench.stats import RequestResult, Slo, summarize
from infer_ctl.bench.workloads import WorkloadSpec, build


@dataclass
class BenchOutcome:
    summary: dict[str, Any]
    results: list[RequestResult]


async def bench_async(url: str, workload: WorkloadSpec, load: LoadSpec, slo: Slo, *, time_scale: float | None = None
                      ) -> BenchOutcome:
    requests = build(workload)
    scale = time_scale if time_scale is not None else await detect_time_scale(url)
    load = replace(load, time_scale=scale)
    run = await run_load(url, requests, load)
    results = run.results
    summary = summarize(results, run.duration_s, slo, scale)
    if run.stopped:
        summary["stopped"] = run.stopped
        summary["not_sent"] = run.not_sent
    summary["workload"] = {"name": workload.name, "requests": workload.requests, "seed": workload.seed,
                           "max_new_tokens": workload.max_new_tokens}
    summary["load"] = {"concurrency": load.concurrency if load.rate is None else None, "rate": load.rate,
                       "api": load.api}
    summary["url"] = url
    return BenchOutcome(summary, results)


def run_bench(url: str, workload: WorkloadSpec, load: LoadSpec, slo: Slo, *, time_scale: float | None = None
              ) -> BenchOutcome:
    """Synchronous entry point (the CLI, the demo): its own event loop, uvloop when available."""
    try:
        import uvloop

        return uvloop.run(bench_async(url, workload, load, slo, time_scale=time_scale))
    except ImportError:  # pragma: no cover
        return asyncio.run(bench_async(url, workload, load, slo, time_scale=time_scale))
