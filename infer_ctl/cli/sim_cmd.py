"""`inferctl sim serve`: SGLang-compatible simulated workers in one process (see docs/simulator.md)."""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Annotated, Any

import typer
from rich.table import Table

from infer_ctl.aio import new_event_loop
from infer_ctl.cli.common import JsonOpt, ProfileOpt, Session, get_profile, session
from infer_ctl.errors import UsageError
from infer_ctl.sim.cluster import start_cluster
from infer_ctl.sim.config import Role, WorkerSpec
from infer_ctl.sim.from_profile import specs_from_profile
from infer_ctl.sim.kv_ports import assign_kv_event_ports
from infer_ctl.sim.specparse import fresh_workloads, parse_worker, spec_knobs

app = typer.Typer(help="SGLang-compatible simulated workers (no GPU needed).", no_args_is_help=True)


@app.command("serve")
def serve(
    worker: Annotated[list[str] | None, typer.Option("--worker", help="ROLE@HOST:PORT/BOOTSTRAP_PORT (host, port and bootstrap port optional), repeatable; ROLE is prefill, decode or mixed.")] = None,
    prefill: Annotated[int, typer.Option("--prefill", help="Add N prefill workers on free ports.")] = 0,
    decode: Annotated[int, typer.Option("--decode", help="Add N decode workers on free ports.")] = 0,
    mixed: Annotated[int, typer.Option("--mixed", help="Add N mixed (non-PD) workers on free ports.")] = 0,
    profile: ProfileOpt = None,
    from_profile: Annotated[bool, typer.Option("--from-profile", help="Serve the workers the profile describes.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed (worker i uses seed + i).")] = 0,
    preset: Annotated[str | None, typer.Option("--preset", help="Hardware/model timing preset.")] = None,
    time_scale: Annotated[float, typer.Option("--time-scale", help="Wall seconds per model second.")] = 1.0,
    cache_tokens: Annotated[int | None, typer.Option("--cache-tokens", help="Radix cache capacity in tokens.")] = None,
    eviction_policy: Annotated[str, typer.Option("--eviction-policy", help="lru or priority.")] = "lru",
    no_spec: Annotated[bool, typer.Option("--no-spec", help="Disable speculative decoding.")] = False,
    spec_alpha: Annotated[float | None, typer.Option("--spec-alpha", help="Per-token draft acceptance rate.")] = None,
    spec_steps: Annotated[int | None, typer.Option("--speculative-num-steps", help="Draft steps per verification (gamma).")] = None,
    spec_domain: Annotated[list[str] | None, typer.Option("--spec-domain", help="DOMAIN=ALPHA: a workload domain's acceptance (requests name it in custom_labels.domain), repeatable.")] = None,
    spec_default_domain: Annotated[str | None, typer.Option("--spec-default-domain", help="Domain of requests that name none (default: --spec-alpha).")] = None,
    spec_drift: Annotated[list[str] | None, typer.Option("--spec-drift", help="SECONDS:DOMAIN=ALPHA: at that model second the domain's alpha changes, repeatable.")] = None,
    draft_mismatch: Annotated[bool, typer.Option("--draft-tokenizer-mismatch", help="Simulate a draft whose tokenizer differs from the target's (~0 acceptance).")] = False,
    spec_adaptive: Annotated[bool, typer.Option("--speculative-adaptive", help="SGLang's adaptive step count (EMA of accepted drafts).")] = False,
    spec_adaptive_config: Annotated[str | None, typer.Option("--speculative-adaptive-config", help="SGLang's adaptive config JSON file.")] = None,
    decode_log_interval: Annotated[int | None, typer.Option("--decode-log-interval", help="Decode batches per speculative gauge update (SGLang: 40).")] = None,
    kv_events_config: Annotated[str | None, typer.Option("--kv-events-config", help="SGLang's KV events JSON, e.g. '{\"publisher\":\"zmq\"}'; worker i publishes on the endpoint/replay ports + i.")] = None,
    page_size: Annotated[int | None, typer.Option("--page-size", help="Tokens per KV page (SGLang's --page-size; KV event block size).")] = None,
    hicache_ratio: Annotated[float | None, typer.Option("--hicache-ratio", help="HiCache host tier: host pool / HBM pool (prefill and mixed workers).")] = None,
    hicache_size: Annotated[float | None, typer.Option("--hicache-size", help="HiCache host tier in GB per rank (instead of --hicache-ratio).")] = None,
    hicache_write_policy: Annotated[str | None, typer.Option("--hicache-write-policy", help="write_through, write_through_selective or write_back.")] = None,
    hicache_host_gbs: Annotated[float | None, typer.Option("--hicache-host-gbs", help="Host <-> GPU GB/s per GPU (default 50).")] = None,
    hicache_storage_backend: Annotated[str | None, typer.Option("--hicache-storage-backend", help="Add a storage tier under the host tier (e.g. file).")] = None,
    hicache_storage_gb: Annotated[float | None, typer.Option("--hicache-storage-gb", help="Storage tier capacity, GB of KV per rank (default unbounded).")] = None,
    hicache_storage_gbs: Annotated[float | None, typer.Option("--hicache-storage-gbs", help="Storage read GB/s of a server (default 5).")] = None,
    hicache_prefetch_policy: Annotated[str | None, typer.Option("--hicache-storage-prefetch-policy", help="timeout, wait_complete or best_effort.")] = None,
    hicache_host_memory_mode: Annotated[str | None, typer.Option("--hicache-host-memory-mode", help="cache, or buffer_only (host memory only stages to storage).")] = None,
    admin_api_key: Annotated[str | None, typer.Option("--admin-api-key", help="SGLang's admin key: GET/PUT/DELETE /hicache/storage-backend answer only with it.")] = None,
    enable_pd_role_switch: Annotated[bool, typer.Option("--enable-pd-role-switch", help="SGLang's runtime role switch: POST /pd_role_switch (needs --no-spec).")] = False,
    tokenizer: Annotated[str | None, typer.Option("--tokenizer", help="A tokenizer.json, or the model directory holding it, to use instead of the built-in one.")] = None,
    model: Annotated[str | None, typer.Option("--served-model-name", help="The model name the workers report and accept (SGLang's --served-model-name).")] = None,
    json_: JsonOpt = False,
) -> None:
    """Start simulated prefill/decode/mixed workers and serve until interrupted (Ctrl-C or SIGTERM)."""
    sess = session(json_)
    knobs: dict[str, Any] = {k: v for k, v in {"time_scale": time_scale, "cache_capacity_tokens": cache_tokens,
                               "eviction_policy": eviction_policy, "spec_alpha": spec_alpha, "tokenizer_path": tokenizer,
                               "preset": preset, "model": model, "page_size": page_size, "speculative": False if no_spec else None,
                               # HiCache tiers (sim/tiers.py)
                               "hicache_ratio": hicache_ratio, "hicache_size_gb": hicache_size,
                               "hicache_write_policy": hicache_write_policy, "hicache_host_gb_s": hicache_host_gbs,
                               "hicache_storage_backend": hicache_storage_backend, "hicache_storage_gb": hicache_storage_gb,
                               "hicache_storage_gb_s": hicache_storage_gbs,
                               "hicache_prefetch_policy": hicache_prefetch_policy,
                               "hicache_host_memory_mode": hicache_host_memory_mode, "admin_api_key": admin_api_key,
                               "enable_pd_role_switch": enable_pd_role_switch or None}.items()
             if v is not None}
    try:
        knobs.update(spec_knobs(domains=spec_domain, default_domain=spec_default_domain, drift=spec_drift,
                                draft_tokenizer_mismatch=draft_mismatch, adaptive=spec_adaptive,
                                adaptive_config=spec_adaptive_config, gamma=spec_steps,
                                decode_log_interval=decode_log_interval))
        specs = specs_from_profile(get_profile(profile), seed=seed, **knobs) if from_profile else []
        specs += [parse_worker(w, seed=seed + len(specs) + i, **knobs) for i, w in enumerate(worker or [])]
        counts: list[tuple[Role, int]] = [("prefill", prefill), ("decode", decode), ("mixed", mixed)]
        for role, count in counts:
            if count < 0:  # range(-1) is empty: it read as "no workers to serve"
                raise ValueError(f"--{role} must be a count >= 0, got {count}")
            specs += [WorkerSpec(role, seed=seed + len(specs) + i, **knobs) for i in range(count)]
        fresh_workloads(specs)
        specs = assign_kv_event_ports(specs, kv_events_config)
    except ValueError as exc:
        raise UsageError(str(exc), remedy="see `inferctl sim serve --help`") from None
    if not specs:
        raise UsageError("no workers to serve", remedy="give --worker ROLE, --prefill/--decode/--mixed N or --from-profile")
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(specs, sess, json_))
    finally:
        loop.close()


async def _serve(specs: list[WorkerSpec], sess: Session, json_mode: bool) -> None:
    cluster = await start_cluster(specs)
    rows = [{"role": w.spec.role, "url": w.url, "bootstrap_port": w.bootstrap_port if w.spec.role == "prefill" else None,
             "kv_events": w.kv_events.endpoint if w.kv_events is not None and w.kv_events.enabled else None}
            for w in cluster.workers]
    if json_mode:
        # one line, printed once the workers listen: a supervising script reads it and proceeds
        print(json.dumps({"command": "sim serve", "status": "ok", "exit_code": 0, "workers": rows}), flush=True)
    else:
        table = Table(title=f"inferctl sim: {len(rows)} simulated SGLang workers (Ctrl-C to stop)")
        for col in ("role", "url", "bootstrap", "kv events"):
            table.add_column(col)
        for r in rows:
            table.add_row(str(r["role"]), str(r["url"]), str(r["bootstrap_port"] or "-"), str(r["kv_events"] or "-"))
        sess.out.print(table)
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    try:
        await done.wait()
    finally:
        await cluster.stop()
