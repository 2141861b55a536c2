"""`inferctl bench`: load-generate against a router or worker and report latencies, goodput, hit rate."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Annotated

import typer

from infer_ctl.atomicfile import write_atomic
from infer_ctl.bench.client import APIS, LoadSpec
from infer_ctl.bench.report import plot, render
from infer_ctl.bench.run import run_bench
from infer_ctl.bench.stats import Slo
from infer_ctl.bench.workloads import WORKLOADS, WorkloadSpec
from infer_ctl.cli.common import JsonOpt, finish, session
from infer_ctl.core.report import Report
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode


def tenant_key(var: str | None) -> str | None:
    """The key from the environment variable `var` (the secret never passes through argv)."""
    if var is None:
        return None
    key = os.environ.get(var, "").strip()
    if not key:
        raise UsageError(f"--tenant-key-env {var}: the variable is not set or empty",
                         remedy=f"export {var}=<the tenant's key> (inferctl router tenant-key makes one)")
    return key


def bench(
    url: Annotated[str, typer.Option("--url", "-u", help="Router or worker base URL, e.g. http://127.0.0.1:8000.")],
    workload: Annotated[str, typer.Option("--workload", "-w", help=f"One of: {', '.join(WORKLOADS)}.")] = "shared-prefix",
    requests: Annotated[int, typer.Option("--requests", help="Number of requests.")] = 200,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Requests (sessions) in flight.")] = 32,
    rate: Annotated[float | None, typer.Option("--rate", help="Open loop: Poisson arrivals per second (overrides --concurrency).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the workload and arrivals.")] = 0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Output tokens per request.")] = 128,
    api: Annotated[str, typer.Option("--api", help=f"Endpoint family: {', '.join(APIS)}.")] = "generate",
    slo_ttft_ms: Annotated[float, typer.Option("--slo-ttft-ms", help="Goodput SLO on time to first token.")] = 2000.0,
    slo_tpot_ms: Annotated[float, typer.Option("--slo-tpot-ms", help="Goodput SLO on time per output token.")] = 100.0,
    time_scale: Annotated[float | None, typer.Option("--time-scale", help="Wall s per model s (default: the simulator's, else 1).")] = None,
    domain: Annotated[str | None, typer.Option("--domain", help="Label every request with SGLang's custom_labels domain (e.g. code, chat).")] = None,
    out: Annotated[str | None, typer.Option("--out", "-o", help="Write the JSON summary + per-request results here.")] = None,
    plot_path: Annotated[str | None, typer.Option("--plot", help="Write latency CDFs and hit rate over time (PNG).")] = None,
    tenant_key_env: Annotated[str | None, typer.Option("--tenant-key-env", metavar="VAR", help="Send the API key in this environment variable as Authorization: Bearer (a router tenant's key; never the key itself on the command line).")] = None,
    json_: JsonOpt = False,
) -> None:
    """Run a workload (SGLang bench_serving style) and print TTFT/ITL/E2E percentiles, throughput, goodput.

    Exit 0 all completed, 1 some failed, 2 none completed, 3 nothing listens at --url (stopped at once)."""
    sess = session(json_)
    api_key = tenant_key(tenant_key_env)
    try:
        wl = WorkloadSpec(name=workload, requests=requests, seed=seed, max_new_tokens=max_new_tokens)
        load = LoadSpec(concurrency=None if rate else concurrency, rate=rate, seed=seed, api=api, domain=domain,
                        api_key=api_key)
        outcome = run_bench(url, wl, load, Slo(slo_ttft_ms / 1000, slo_tpot_ms / 1000), time_scale=time_scale)
    except ValueError as exc:
        raise UsageError(str(exc), remedy="see `inferctl bench --help`") from None
    s = outcome.summary
    if out:
        doc = {"summary": s, "results": [r.__dict__ | {"tpot": r.tpot, "spec": asdict(r.spec) if r.spec else None}
                                         for r in outcome.results]}
        write_atomic(out, json.dumps(doc, indent=2) + "\n")
    if plot_path:
        plot(outcome.results, plot_path)
    report = Report(command="bench", profile=None, data={"summary": s})
    report.exit_code_override = ExitCode.OK if s["failed"] == 0 else ExitCode.FAIL if not s["completed"] else ExitCode.WARN
    if s.get("stopped"):  # nothing listens there: unreachable, as `router status` and `nodes` say it
        report.exit_code_override = ExitCode.UNKNOWN
        if not json_:
            typer.echo(f"inferctl: error: {s['stopped']}", err=True)
            typer.echo("  hint: check --url (is the router or server running there?)", err=True)
    finish(sess, report, lambda console: render(console, s, f"inferctl bench: {workload} -> {url}"))
