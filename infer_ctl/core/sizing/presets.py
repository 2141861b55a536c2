"""Architecture numbers of common models and peak numbers of common accelerators.

Model numbers come from each model's published config.json (num_hidden_layers, num_key_value_heads,
hidden_size / num_attention_heads). Accelerator numbers are the vendors' datasheet peak dense
FP16/BF16 (no sparsity) and HBM bandwidth.
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
            "llama-2-7b", layers=32, kv_heads=32, head_dim=128, params=6_738_415_616, attention_heads=32
        ),
        ModelPreset(
            "llama-2-70b", layers=80, kv_heads=8, head_dim=128, params=68_976_648_192, attention_heads=64
        ),
        ModelPreset(
            "llama-3.1-8b", layers=32, kv_heads=8, head_dim=128, params=8_030_261_248, attention_heads=32
        ),
        ModelPreset(
            "llama-3.1-70b", layers=80, kv_heads=8, head_dim=128, params=70_553_706_496, attention_heads=64
        ),
        ModelPreset(
            "llama-3.1-405b",
            layers=126,
            kv_heads=8,
            head_dim=128,
            params=405_853_388_800,
            attention_heads=128,
        ),
        ModelPreset(
            "mistral-large-2", layers=88, kv_heads=8, head_dim=128, params=122_610_069_504, attention_heads=96
        ),
        ModelPreset(
            "qwen2.5-72b", layers=80, kv_heads=8, head_dim=128, params=72_706_203_648, attention_heads=64
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
    )
}


def _normalize(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-").removeprefix("meta-")


def lookup(name: str, table: dict[str, ModelPreset] | dict[str, AcceleratorPreset], kind: str):
    key = _normalize(name)
    if key in table:
        return table[key]
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
