"""The one-line summary of every verb, for root `--help` without importing any command module.

Root help used to import every verb's module (the router, the simulator, paramiko, pydantic: 1.2-1.4 s
on a quiet machine, 2-4 s on a busy one) to print sixteen lines. `tests/cli/test_help.py` checks that
these lines are the ones the loaded commands give, in the same order, so they cannot drift."""

from __future__ import annotations

#: verb -> summary, in the order root help lists them (typer puts commands before groups)
SUMMARIES: dict[str, str] = {
    "nodes": "Reachability of every node: connect, auth, sudo, OS, kernel, python3, uptime. Exit 3 if any "
    "is unreachable.",
    "exec": "Run COMMAND on every selected node. Exit 0 all returned 0, 2 any failed, 3 any unreachable "
    "(none failed).",
    "audit": "Run all check families. Exit 0 ok, 1 warn, 2 fail, 3 unknown (the whole run, also with "
    "--since-last).",
    "launch": "Start (or restart what changed of) the SGLang servers of the profile and wait until they "
    "are healthy.",
    "status": "Per instance: process state, health, model, PD mode, speculative algorithm, accept length, "
    "cache hits.",
    "stop": "Stop servers gracefully (SIGTERM, then SIGKILL only after sglang.lifecycle.stop_timeout_s); "
    "decodes first.",
    "logs": "Print an instance's server log (journal or log file). To a terminal, control sequences in it "
    "are shown as escapes; piped or redirected, the log text is written exactly.",
    "bench": "Run a workload (SGLang bench_serving style) and print TTFT/ITL/E2E percentiles, throughput, "
    "goodput.",
    "demo": "Start the profile's cluster as simulated SGLang workers, route a shared-prefix bench through "
    "the router, print the results and shut everything down. `--scenario spec-drift`: the workload's "
    "domain shifts mid-run; shows alpha falling, the alert, the recommendation and (control act) the "
    "relaunch of the drifted pool and the recovered throughput.",
    "profile": "Write a first profile, validate it, show it resolved.",
    "provision": "Provision nodes: plan (default) or apply host changes, idempotently.",
    "check": "Run one family of health checks (gpu, fabric, tokenizer, servers, spec).",
    "router": "The PD-aware, prefix-cache-aware router and its named prefixes.",
    "spec": "Speculative decoding in operation: the acceptance controller.",
    "pd": "Prefill:decode disaggregation in operation: the pool balance controller.",
    "plan": "Sizing math: KV footprint and tiers, speculative speedup, KV transfer time, roofline, cost.",
    "sim": "SGLang-compatible simulated workers (no GPU needed).",
}
