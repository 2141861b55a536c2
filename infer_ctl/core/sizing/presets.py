"""Architecture numbers of common models and peak numbers of common accelerators.

Model numbers come from each model's published config.json (num_hidden_layers, num_key_value_heads,
hidden_size / num_attention_heads, max_position_embeddings; for MLA models kv_lora_rank,
qk_rope_head_dim, qk_nope_head_dim, v_head_dim). Accelerator numbers are the vendors' datasheet peak
dense FP16/BF16 (no sparsity) and HBM bandwidth.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


@dataclass(frozen=True)
class ModelPreset:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    params: int  # parameter count, for weight bytes and FLOPs per token
    attention_heads: int
    context_length: int | None = None  # max_position_embeddings
    # Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one latent of
    # kv_lora_rank + qk_rope_head_dim values per token per layer instead of K and V per KV head.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_head_dim: int | None = None  # query/key width per head when it differs from head_dim (MLA: nope + rope)
    active_params: int | None = None  # parameters used per token (MoE); None = all of them

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def flops_params(self) -> int:
        """Parameters one token's forward pass multiplies by (all of a dense model, the active ones of an MoE)."""
        return self.active_params if self.active_params is not None else self.params


@dataclass(frozen=True)
class AcceleratorPreset:
    name: str
    fp16_tflops: float  # dense, no sparsity
    hbm_tb_s: float
    hbm_gb: float


MODELS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "llama-2-7b",
            layers=32,
            kv_heads=32,
            head_dim=128,
            params=6_738_415_616,
            attention_heads=32,
            context_length=4096,
        ),
        ModelPreset(
            "llama-2-70b",
            layers=80,
            kv_heads=8,
            head_dim=128,
            params=68_976_648_192,
            attention_heads=64,
            context_length=4096,
        ),
        ModelPreset(
            "llama-3.1-8b",
            layers=32,
            kv_heads=8,
            head_dim=128,
            params=8_030_261_248,
            attention_heads=32,
            context_length=131072,
        ),
        ModelPreset(
            "llama-3.1-70b",
            layers=80,
            kv_heads=8,
            head_dim=128,
            params=70_553_706_496,
            attention_heads=64,
            context_length=131072,
        ),
        ModelPreset(
            "llama-3.1-405b",
            layers=126,
            kv_heads=8,
            head_dim=128,
            params=405_853_388_800,
            attention_heads=128,
            context_length=131072,
        ),
        # DeepSeek-V3 (config.json: 61 layers, 128 heads, kv_lora_rank 512, qk_rope_head_dim 64,
        # qk_nope_head_dim 128, v_head_dim 128, max_position_embeddings 163840). params counts the
        # main model from that config (MTP module excluded): 671,026,419,200; active per token
        # (8 of 256 routed experts + 1 shared, embeddings and lm_head included): 37,552,297,472.
        ModelPreset(
            "deepseek-v3",
            layers=61,
            kv_heads=128,
            head_dim=128,
            params=671_026_419_200,
            attention_heads=128,
            context_length=163840,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_head_dim=192,
            active_params=37_552_297_472,
        ),
        ModelPreset(
            "mistral-large-2",
            layers=88,
            kv_heads=8,
            head_dim=128,
            params=122_610_069_504,
            attention_heads=96,
            context_length=131072,
        ),
        ModelPreset(
            "qwen2.5-72b",
            layers=80,
            kv_heads=8,
            head_dim=128,
            params=72_706_203_648,
            attention_heads=64,
            context_length=32768,
        ),
    )
}

ACCELERATORS: dict[str, AcceleratorPreset] = {
    a.name: a
    for a in (
        AcceleratorPreset("h100-sxm", fp16_tflops=989.4, hbm_tb_s=3.35, hbm_gb=80),
        AcceleratorPreset("h200", fp16_tflops=989.4, hbm_tb_s=4.8, hbm_gb=141),
        AcceleratorPreset("b200", fp16_tflops=2250.0, hbm_tb_s=8.0, hbm_gb=180),
        AcceleratorPreset("mi300x", fp16_tflops=1307.4, hbm_tb_s=5.3, hbm_gb=192),
        # NVIDIA L40S datasheet (Ada Lovelace, PCIe card): 48 GB GDDR6 (not HBM; hbm_* hold its memory),
        # 864 GB/s, BF16/FP16 tensor 362.05 TFLOPS dense (733 with sparsity), FP8 733 dense; PCIe Gen4 x16
        # (64 GB/s bidirectional), no NVLink, so TP across L40S cards runs over PCIe.
        AcceleratorPreset("l40s", fp16_tflops=362.05, hbm_tb_s=0.864, hbm_gb=48),
    )
}


def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("meta-")


def lookup(name: str, table: dict[str, ModelPreset] | dict[str, AcceleratorPreset], kind: str):
    key = _normalize(name)
    if key in table:
        return table[key]
    # a name the preset starts with ("h100" for "h100-sxm") before a merely similar one ("h200")
    close = [k for k in table if k.startswith(key)] if key else []
    if len(close) != 1:
        close = difflib.get_close_matches(key, list(table), n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown {kind} preset {name!r}{hint}; known: {', '.join(table)}")


def model_preset(name: str) -> ModelPreset:
    return lookup(name, MODELS, "model")


def accelerator_preset(name: str) -> AcceleratorPreset:
    return lookup(name, ACCELERATORS, "accelerator")


def dtype_bytes(dtype: str) -> int:
    key = dtype.strip().lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]
