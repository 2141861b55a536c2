"""What one worker reports about itself: the `/v1/loads` snapshot and the `/metrics` text, read from its
engine (queues, counters), radix cache (size, evictions) and room table (PD queues, failures).

The counters and their Prometheus rendering live in `metrics.py`; this module only gathers the gauges,
so a new source of facts (another cache tier, KV events) adds its gauges here.
"""

from __future__ import annotations

from typing import Any

from infer_ctl.core.promtext import render as render_families
from infer_ctl.sim.metrics import render as render_metrics
from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.tiers import tier_families

#: /v1/loads ?include= names of the sections the simulator has (SGLang: managers/load_snapshot.py)
LOAD_SECTIONS = {"speculative": "spec", "disaggregation": "disagg"}
LOAD_INCLUDES = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def load_snapshot(state: WorkerState, include: set[str] | None = None) -> dict[str, Any]:
    """One dp rank's entry of SGLang's load snapshot (`/v1/loads` "loads"); `include` selects sections
    as `LoadSnapshot.to_dict` does (None or "all": every section; core fields always). Raises ValueError
    for an unknown section name."""
    if include is not None and not include <= LOAD_INCLUDES:
        raise ValueError(
            f"Invalid include sections: {include - LOAD_INCLUDES}. Valid options: {sorted(LOAD_INCLUDES)}"
        )
    e, t, rooms = state.running_engine(), state.timing, state.rooms
    used = state.cache.size + sum(r.prompt_tokens + len(r.output_ids) for r in e.running)
    waiting = [*e.prefill_queue, *e.decode_waiting]
    load: dict[str, Any] = {
        "dp_rank": 0,
        "num_running_reqs": len(e.running),
        "num_waiting_reqs": len(waiting),
        "num_waiting_uncached_tokens": e.waiting_uncached_tokens(),
        "num_used_tokens": used,
        "num_total_tokens": t.kv_capacity_tokens,
        "max_total_num_tokens": t.kv_capacity_tokens,
        "token_usage": min(1.0, used / t.kv_capacity_tokens),
        "gen_throughput": e.last_gen_throughput,
        "cache_hit_rate": e.metrics.cache_hit_rate,
        "utilization": len(e.running) / t.max_running_requests,
        # SGLang: totals of the completed log intervals, and the last interval's rate; no section before
        # the first interval completed (load_inquirer.py) or without speculation
        "speculative": None
        if (avg := e.metrics.spec_avg_accept_length) is None
        else {"accept_length": avg, "accept_rate": e.metrics.spec_accept_rate},
        "disaggregation": {
            "prefill_bootstrap_queue_reqs": rooms.waiting_for_decode,
            "prefill_inflight_queue_reqs": rooms.inflight,
            "decode_prealloc_queue_reqs": len(e.decode_waiting) if state.role == "decode" else 0,
            "decode_transfer_queue_reqs": 0,
            # set by the prefill's last finished transfer, 0.0 on a decode (SGLang 0.5.23 reports them in
            # PREFILL mode only: scheduler_components/metrics_reporter.py)
            "kv_transfer_speed_gb_s": e.metrics.kv_transfer_speed_gb_s,
            "kv_transfer_latency_ms": e.metrics.kv_transfer_latency_ms,
        },
    }
    for key, name in LOAD_SECTIONS.items():
        if load[key] is None or (include is not None and "all" not in include and name not in include):
            del load[key]
    return load


def metrics_text(state: WorkerState) -> str:
    """The Prometheus exposition of `/metrics` (and `/v1/loads?format=prometheus`)."""
    e, load, rooms, spec = state.running_engine(), load_snapshot(state), state.rooms, state.spec
    labels = {
        "model_name": spec.model,
        # SGLang keeps one series across role flips: engine_type "dynamic" (metrics_collector.py)
        "engine_type": "dynamic" if spec.enable_pd_role_switch else {"mixed": "unified"}.get(spec.role, spec.role),
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }
    gauges = {
        "num_running_reqs": load["num_running_reqs"],
        "num_queue_reqs": load["num_waiting_reqs"],
        "num_used_tokens": load["num_used_tokens"],
        "token_usage": load["token_usage"],
        "kv_available_tokens": max(0, state.timing.kv_capacity_tokens - load["num_used_tokens"]),
        "gen_throughput": load["gen_throughput"],
        "utilization": load["utilization"],
        "num_prefill_bootstrap_queue_reqs": rooms.waiting_for_decode,
        "num_prefill_inflight_queue_reqs": rooms.inflight,
        "num_decode_prealloc_queue_reqs": load["disaggregation"]["decode_prealloc_queue_reqs"],
        "num_decode_transfer_queue_reqs": 0,
    }
    # the room table counts PD failures on the prefill side, the KV receiver on the decode side
    e.metrics.bootstrap_failed = rooms.bootstrap_failed
    e.metrics.transfer_failed = max(e.metrics.transfer_failed, rooms.transfer_failed)
    # SGLang's sglang:evicted_tokens_total is a counter (device KV slots freed by eviction)
    text = render_metrics(e.metrics, labels, gauges, counters={"evicted_tokens_total": state.cache.evicted_total},
                          pd=state.launch_mode != "null")
    tiers = tier_families(state.cache, labels)  # HiCache's series (sim/tiers.py), none without tiers
    return text if not tiers else text.rstrip("\n") + "\n" + render_families(tiers)
