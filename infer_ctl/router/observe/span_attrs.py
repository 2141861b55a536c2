"""The request span's attributes beyond the GenAI conventions (`inferctl.*`), computed from what the router
holds when the request ends. Pure functions of their inputs (tracing.py sets them), each value naming its
source, since a trace reader must know whether a number is SGLang's own, the router's measurement, or a
model of both:

| attribute | source |
|---|---|
| inferctl.spec.verify_steps | SGLang meta_info `spec_verify_ct` (tokenizer_manager._calculate_spec_decoding_metrics) |
| inferctl.spec.accept_length | SGLang's `spec_accept_length` = completion_tokens / spec_verify_ct, summed over choices |
| inferctl.spec.accept_rate | SGLang's `spec_accept_rate` = spec_num_correct_drafts / spec_num_proposed_drafts |
| inferctl.spec.drafted_tokens | SGLang's `spec_num_proposed_drafts` (= verify steps x (num_draft_tokens - 1)) |
| inferctl.spec.accepted_tokens | SGLang's `spec_num_correct_drafts` |
| inferctl.spec.gamma | the lookahead: spec_num_proposed_drafts / spec_verify_ct (SGLang's launch num_draft_tokens - 1) |
| inferctl.spec.speedup | the router's model: accept_length / (gamma x c + 1) (core/sizing/spec.py's speedup with the measured E[N]) |
| inferctl.spec.cost_ratio | c of that model: the profile's speculative.cost_ratio (else 0.1) |
| inferctl.spec.num_steps | /server_info `speculative_num_steps` (the live one from internal_states under adaptive) |
| inferctl.spec.algorithm | /server_info `speculative_algorithm` |
| inferctl.spec.draft_model | /server_info `speculative_draft_model_path` |
| inferctl.kv.transfer_backend | /server_info `disaggregation_transfer_backend` (mooncake, nixl, ...) of the decode |
| inferctl.kv.ib_device | /server_info `disaggregation_ib_device` of the decode (the RDMA devices the KV crosses) |
| inferctl.kv.transfer_ms | the pair's last KV transfer as SGLang's prefill measured it (/v1/loads `kv_transfer_latency_ms`, fleet/pair_health.py) |
| inferctl.kv.transfer_gb_s | the same transfer's `kv_transfer_speed_gb_s` |
| inferctl.kv.transfer_bytes | speed x latency of that transfer (SGLang computes the speed as its bytes / its latency) |
| inferctl.kv.sample_age_s | how old that pair measurement is: it is the pair's latest, not necessarily this request's |
| inferctl.itl.p50_s, .p99_s, .max_s | the router's own clock: gaps between the stream's consecutive content chunks as they arrive |
| inferctl.itl.chunks | how many gaps those percentiles are over |
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from infer_ctl.core.routing.spec_fields import SpecFields

#: gaps kept per stream for its ITL percentiles (a longer stream's percentiles are over its first gaps):
#: memory stays bounded whatever the client's max_tokens
MAX_GAPS = 65_536


def spec_attributes(fields: Sequence[SpecFields], cost_ratio: float) -> dict[str, Any]:
    """Totals over the answer's choices (a /generate batch's prompts) and the ratios over the totals."""
    verify = sum(f.verify_ct for f in fields)
    if not verify:
        return {}
    proposed = sum(f.num_proposed_drafts for f in fields)
    correct = sum(f.num_correct_drafts for f in fields)
    accept_length = sum(f.completion_tokens for f in fields) / verify
    out: dict[str, Any] = {
        "inferctl.spec.verify_steps": verify,
        "inferctl.spec.accept_length": accept_length,
        "inferctl.spec.drafted_tokens": proposed,
        "inferctl.spec.accepted_tokens": correct,
    }
    if proposed:
        gamma = proposed / verify
        out["inferctl.spec.accept_rate"] = correct / proposed
        out["inferctl.spec.gamma"] = round(gamma, 4)
        # the measured tokens per verify step over the cost of one: gamma draft steps at c each plus the
        # target's verify (core/sizing/spec.py speedup, with E[N] measured instead of modelled from alpha)
        out["inferctl.spec.speedup"] = round(accept_length / (gamma * cost_ratio + 1.0), 4)
        out["inferctl.spec.cost_ratio"] = cost_ratio
    return out


def decode_attributes(decode: Any, fabric: tuple[str | None, str | None] | None) -> dict[str, Any]:
    """What the decode's /server_info says (spec_stats.DecodeSpec and SpecStats.fabric)."""
    out: dict[str, Any] = {}
    if decode is not None:
        for key, value in (("inferctl.spec.draft_model", decode.draft), ("inferctl.spec.algorithm", decode.algorithm),
                           ("inferctl.spec.num_steps", decode.num_steps)):
            if value is not None:
                out[key] = value
    if fabric is not None:
        backend, device = fabric
        if backend:
            out["inferctl.kv.transfer_backend"] = backend
        if device:
            out["inferctl.kv.ib_device"] = device
    return out


def kv_attributes(pair: Any, now: float) -> dict[str, Any]:
    """The pair's last measured KV transfer (core/routing/pair_health.PairState), when there is one."""
    if pair is None or pair.sample_at is None:
        return {}
    out: dict[str, Any] = {"inferctl.kv.sample_age_s": round(max(0.0, now - pair.sample_at), 3)}
    if pair.latency_ms is not None:
        out["inferctl.kv.transfer_ms"] = pair.latency_ms
    if pair.speed_gb_s is not None:
        out["inferctl.kv.transfer_gb_s"] = pair.speed_gb_s
    if pair.latency_ms is not None and pair.speed_gb_s is not None:
        out["inferctl.kv.transfer_bytes"] = int(pair.speed_gb_s * 1e9 * pair.latency_ms / 1e3)
    return out


def _rank(ordered: Sequence[float], q: float) -> float:
    """The nearest-rank percentile q of sorted values (an observed gap, never an interpolation)."""
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def itl_attributes(times: Sequence[float]) -> dict[str, Any]:
    """p50 / p99 / max of the gaps between consecutive arrival times (at least two gaps)."""
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    if len(gaps) < 2:
        return {}
    return {"inferctl.itl.p50_s": _rank(gaps, 0.50), "inferctl.itl.p99_s": _rank(gaps, 0.99),
            "inferctl.itl.max_s": gaps[-1], "inferctl.itl.chunks": len(gaps)}
