"""KV-cache footprint: bytes = 2 (K and V) x dtype_bytes x layers x kv_heads x head_dim x tokens."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KvPlan:
    kv_bytes_per_token: int
    context: int
    kv_bytes: int  # one request at `context` tokens
    hbm_bytes: int | None
    weights_bytes: int | None
    kv_budget_bytes: int | None
    max_tokens: int | None
    max_concurrent: int | None


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return 2 * dtype_bytes * layers * kv_heads * head_dim


def plan_kv(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    context: int,
    hbm_bytes: int | None = None,
    weights_bytes: int | None = None,
    mem_fraction: float = 1.0,
) -> KvPlan:
    """Per-token and per-request KV bytes, and how many full-context requests fit next to the weights.

    `hbm_bytes` is the total over the GPUs serving one replica; `mem_fraction` is the share of it the
    server may use (SGLang's --mem-fraction-static covers weights + KV pool).
    """
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    per_token = kv_bytes_per_token(layers, kv_heads, head_dim, dtype_bytes)
    per_request = per_token * context
    budget = max_tokens = max_conc = None
    if hbm_bytes is not None:
        usable = int(hbm_bytes * mem_fraction)
        budget = usable - (weights_bytes or 0)
        if budget < 0:
            budget = 0
        max_tokens = budget // per_token
        max_conc = budget // per_request
    return KvPlan(per_token, context, per_request, hbm_bytes, weights_bytes, budget, max_tokens, max_conc)
