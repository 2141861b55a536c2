"""Resolving what a plan command was given into the numbers the math takes: the model shape from a
preset and/or explicit dimensions, and input errors that carry their remedy.

The CLI turns an `InputError` into a usage error (exit 64) with its remedy as the hint; core.sizing
cannot import infer_ctl.errors (it is plain math, imported by the simulator).
"""

from __future__ import annotations

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.kv import KvShape


class InputError(ValueError):
    """An impossible or missing input, named as the option that sets it, with what to do instead."""

    def __init__(self, message: str, remedy: str) -> None:
        super().__init__(message)
        self.remedy = remedy


def positive_options(**options: int | None) -> None:
    """An explicit shape option must be >= 1: `--layers 0` is an error, not "use the preset's"."""
    for name, value in options.items():
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise InputError(f"{flag} must be >= 1, got {value}", remedy=f"omit {flag} to use the preset's value")


def _given(value: int | None, default: int | None) -> int | None:
    return value if value is not None else default


def arch(model: str | None, layers: int | None, kv_heads: int | None, head_dim: int | None, *,
         needed_by: str = "") -> tuple[presets.ModelPreset | None, dict[str, int]]:
    """The preset (if any) and the MHA/GQA shape, explicit options winning over the preset."""
    positive_options(layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    preset = presets.model_preset(model) if model else None
    resolved = {
        "layers": _given(layers, preset.layers if preset else None),
        "kv_heads": _given(kv_heads, preset.kv_heads if preset else None),
        "head_dim": _given(head_dim, preset.head_dim if preset else None),
    }
    missing = [f"--{k.replace('_', '-')}" for k, v in resolved.items() if v is None]
    if missing:
        raise InputError(
            f"{needed_by + ' needs the model shape: ' if needed_by else ''}missing {', '.join(missing)}",
            remedy="give --model PRESET or all of --layers --kv-heads --head-dim",
        )
    return preset, {k: v for k, v in resolved.items() if v is not None}


def kv_shape(model: str | None, layers: int | None, kv_heads: int | None, head_dim: int | None,
             kv_lora_rank: int | None = None, rope_dim: int | None = None, *,
             needed_by: str = "") -> tuple[presets.ModelPreset | None, KvShape]:
    """Like `arch`, MLA included: --kv-lora-rank (or an MLA preset) makes the KV one latent per token."""
    positive_options(layers=layers, kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank)
    if rope_dim is not None and rope_dim < 0:
        raise InputError(f"--rope-dim must be >= 0, got {rope_dim}", remedy="DeepSeek-V3: --rope-dim 64")
    preset = presets.model_preset(model) if model else None
    lora = kv_lora_rank if kv_lora_rank is not None else (preset.kv_lora_rank if preset else None)
    if lora is not None:
        n_layers = _given(layers, preset.layers if preset else None)
        if n_layers is None:
            raise InputError(
                f"{needed_by + ' needs the model shape: ' if needed_by else ''}missing --layers",
                remedy="give --model PRESET or --layers with --kv-lora-rank and --rope-dim",
            )
        rope = rope_dim if rope_dim is not None else ((preset.qk_rope_head_dim or 0) if preset else 0)
        # kv_heads / head_dim only matter for attention FLOPs of an MLA model; keep the preset's
        return preset, KvShape(
            layers=n_layers,
            kv_heads=_given(kv_heads, preset.kv_heads if preset else 1) or 1,
            head_dim=_given(head_dim, preset.head_dim if preset else 1) or 1,
            kv_lora_rank=lora,
            rope_dim=rope,
        )
    if rope_dim is not None:
        raise InputError("--rope-dim is for MLA models: give --kv-lora-rank too",
                         remedy="e.g. --kv-lora-rank 512 --rope-dim 64 (DeepSeek-V3)")
    preset, resolved = arch(model, layers, kv_heads, head_dim, needed_by=needed_by)
    return preset, KvShape(**resolved)


def shape_dict(shape: KvShape) -> dict[str, object]:
    out: dict[str, object] = {"layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}
    if shape.is_mla:
        out |= {"kv_lora_rank": shape.kv_lora_rank, "rope_dim": shape.rope_dim}
    return out


def tp_splits(shape: KvShape, tp: int, attention_heads: int | None) -> None:
    """A TP SGLang cannot split the model over is an input error (KvShape.tp_error says why)."""
    if tp >= 1 and (why := shape.tp_error(tp, attention_heads)):
        raise InputError(why, remedy="use a TP that divides the attention and the KV heads")
