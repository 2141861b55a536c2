"""KV-cache footprint: bytes = 2 (K and V) x dtype_bytes x layers x kv_heads x head_dim x tokens (MHA/GQA),
dtype_bytes x layers x (kv_lora_rank + qk_rope_head_dim) x tokens (MLA)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer_ctl.core.sizing.presets import ModelPreset


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


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    _positive(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype_bytes=dtype_bytes)
    return 2 * dtype_bytes * layers * kv_heads * head_dim


def mla_kv_bytes_per_token(layers: int, kv_lora_rank: int, rope_dim: int, dtype_bytes: int) -> int:
    """MLA keeps one compressed latent (kv_lora_rank) plus the decoupled RoPE key (rope_dim) per token
    per layer, no K/V split: SGLang's MLATokenToKVPool allocates kv_cache_dim = kv_lora_rank +
    qk_rope_head_dim per token per layer (sglang/srt/mem_cache/memory_pool.py, 0.5.23)."""
    _positive(layers=layers, kv_lora_rank=kv_lora_rank, dtype_bytes=dtype_bytes)
    if rope_dim < 0:
        raise ValueError(f"rope_dim must be >= 0, got {rope_dim}")
    return dtype_bytes * layers * (kv_lora_rank + rope_dim)


@dataclass(frozen=True)
class KvShape:
    """What one token's KV looks like: MHA/GQA (kv_heads x head_dim for K and for V) or MLA (one latent)."""

    layers: int
    kv_heads: int
    head_dim: int
    kv_lora_rank: int | None = None
    rope_dim: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def bytes_per_token(self, dtype_bytes: int) -> int:
        """One copy of one token's KV over all layers (plan kv's number)."""
        if self.kv_lora_rank is not None:
            return mla_kv_bytes_per_token(self.layers, self.kv_lora_rank, self.rope_dim, dtype_bytes)
        return kv_bytes_per_token(self.layers, self.kv_heads, self.head_dim, dtype_bytes)

    def kv_heads_per_rank(self, tp: int) -> int:
        """SGLang's ModelConfig.get_num_kv_heads (sglang/srt/configs/model_config.py, 0.5.23):
        max(1, kv_heads // tp); with fewer KV heads than ranks each rank keeps (a replica of) one."""
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        return max(1, self.kv_heads // tp)

    def tp_error(self, tp: int, attention_heads: int | None = None) -> str | None:
        """Why SGLang cannot split this model over `tp` ranks, or None. Its attention layers assert
        heads % tp == 0, and KV heads % tp == 0 (kv_heads >= tp) or tp % kv_heads == 0 (fewer KV heads,
        each replicated): sglang/srt/models/llama.py LlamaAttention, deepseek_v2.py (0.5.23). MLA has no
        KV heads to split (one latent, replicated), only its attention heads."""
        if attention_heads is not None and attention_heads % tp:
            return f"--tp {tp} does not divide the {attention_heads} attention heads (SGLang asserts heads % tp == 0)"
        if self.is_mla:
            return None
        kv = self.kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            ok = sorted({d for d in range(1, 2 * kv + 1) if (kv % d == 0 if d <= kv else d % kv == 0)})
            return (f"--tp {tp} does not split {kv} KV heads evenly (SGLang asserts kv_heads % tp == 0, or "
                    f"tp % kv_heads == 0 with fewer KV heads than ranks): use a TP of {', '.join(map(str, ok))}, ...")
        return None

    def bytes_per_token_per_rank(self, dtype_bytes: int, tp: int) -> int:
        """What one tensor-parallel rank stores per token: its KV-head shard (MHA/GQA) or the whole latent
        (MLA is replicated on every attention-TP rank)."""
        if self.kv_lora_rank is not None:
            if tp < 1:
                raise ValueError(f"tp must be >= 1, got {tp}")
            return self.bytes_per_token(dtype_bytes)
        return kv_bytes_per_token(self.layers, self.kv_heads_per_rank(tp), self.head_dim, dtype_bytes)

    def row_bytes(self, dtype_bytes: int, tp: int) -> int:
        """Bytes of one token in one layer's buffer on one rank: a K row (the V row is the same size and
        lives in a separate buffer) for MHA/GQA, the latent row for MLA."""
        if self.kv_lora_rank is not None:
            return self.bytes_per_token_per_rank(dtype_bytes, tp) // self.layers
        return self.bytes_per_token_per_rank(dtype_bytes, tp) // (2 * self.layers)


def shape_of(model: ModelPreset) -> KvShape:
    """The KV shape of a model preset (MLA when it has a kv_lora_rank)."""
    return KvShape(model.layers, model.kv_heads, model.head_dim, model.kv_lora_rank, model.qk_rope_head_dim or 0)


def capacity(
    per_token: int,
    *,
    context: int,
    hbm_bytes: int | None = None,
    weights_bytes: int | None = None,
    mem_fraction: float = 1.0,
) -> KvPlan:
    """How many tokens (and full-context requests) of `per_token` bytes fit next to the weights."""
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    if not 0 < mem_fraction <= 1:
        raise ValueError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    _positive(per_token=per_token)
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
    return capacity(
        per_token, context=context, hbm_bytes=hbm_bytes, weights_bytes=weights_bytes, mem_fraction=mem_fraction
    )
