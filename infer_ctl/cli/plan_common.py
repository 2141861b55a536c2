"""What the `inferctl plan` subcommands share: model-shape options, usage-error guard, table helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.core.findings import Finding
from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.kv import KvShape
from infer_ctl.errors import UsageError

ModelOpt = Annotated[str | None, typer.Option("--model", "-m", help="Model preset (see --list-presets).")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="KV cache dtype: fp16, bf16, fp8, fp32.")]
LayersOpt = Annotated[int | None, typer.Option("--layers", help="Transformer layers.")]
KvHeadsOpt = Annotated[int | None, typer.Option("--kv-heads", help="KV heads (GQA groups).")]
HeadDimOpt = Annotated[int | None, typer.Option("--head-dim", help="Head dimension.")]
KvLoraRankOpt = Annotated[
    int | None, typer.Option("--kv-lora-rank", help="MLA: latent width (DeepSeek-V3: 512); KV = latent + rope.")
]
RopeDimOpt = Annotated[int | None, typer.Option("--rope-dim", help="MLA: qk_rope_head_dim (DeepSeek-V3: 64).")]


def guard(fn, *args: Any, **kwargs: Any) -> Any:
    """Core raises ValueError for impossible inputs; that is a usage error (exit 64)."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        raise UsageError(
            str(exc), remedy="see the ranges in `inferctl plan <kv|spec|transfer|roofline|tiers|cost> --help`"
        ) from None


def positive_options(**options: int | None) -> None:
    """An explicit shape option must be >= 1: `--layers 0` is an error, not "use the preset's"."""
    for name, value in options.items():
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be >= 1, got {value}", remedy=f"omit {flag} to use the preset's value")


def finite_options(options: dict[str, float | None], command: str) -> None:
    """Float options must be finite: NaN passes every range test and crashes int(); inf, the same."""
    for flag, value in options.items():
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}", remedy=f"see `inferctl {command} --help`")


def tp_splits(shape: KvShape, tp: int, attention_heads: int | None) -> None:
    """A TP SGLang cannot split the model over is a usage error (KvShape.tp_error says why)."""
    if tp >= 1 and (why := shape.tp_error(tp, attention_heads)):
        raise UsageError(why, remedy="use a TP that divides the attention and the KV heads")


def _given(value: int | None, default: int | None) -> int | None:
    return value if value is not None else default


def arch(
    model: str | None, layers: int | None, kv_heads: int | None, head_dim: int | None, *, needed_by: str = ""
):
    """The preset (if any) and the MHA/GQA shape, explicit options winning over the preset."""
    positive_options(layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    preset = guard(presets.model_preset, model) if model else None
    resolved = {
        "layers": _given(layers, preset.layers if preset else None),
        "kv_heads": _given(kv_heads, preset.kv_heads if preset else None),
        "head_dim": _given(head_dim, preset.head_dim if preset else None),
    }
    missing = [f"--{k.replace('_', '-')}" for k, v in resolved.items() if v is None]
    if missing:
        raise UsageError(
            f"{needed_by + ' needs the model shape: ' if needed_by else ''}missing {', '.join(missing)}",
            remedy="give --model PRESET or all of --layers --kv-heads --head-dim",
        )
    return preset, resolved


def kv_shape(
    model: str | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    kv_lora_rank: int | None = None,
    rope_dim: int | None = None,
    *,
    needed_by: str = "",
) -> tuple[presets.ModelPreset | None, KvShape]:
    """Like `arch`, MLA included: --kv-lora-rank (or an MLA preset) makes the KV one latent per token."""
    positive_options(layers=layers, kv_heads=kv_heads, head_dim=head_dim, kv_lora_rank=kv_lora_rank)
    if rope_dim is not None and rope_dim < 0:
        raise UsageError(f"--rope-dim must be >= 0, got {rope_dim}", remedy="DeepSeek-V3: --rope-dim 64")
    preset = guard(presets.model_preset, model) if model else None
    lora = kv_lora_rank if kv_lora_rank is not None else (preset.kv_lora_rank if preset else None)
    if lora is not None:
        n_layers = _given(layers, preset.layers if preset else None)
        if n_layers is None:
            raise UsageError(
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
        raise UsageError("--rope-dim is for MLA models: give --kv-lora-rank too",
                         remedy="e.g. --kv-lora-rank 512 --rope-dim 64 (DeepSeek-V3)")
    preset, resolved = arch(model, layers, kv_heads, head_dim, needed_by=needed_by)
    return preset, KvShape(**resolved)


def shape_dict(shape: KvShape) -> dict[str, Any]:
    out: dict[str, Any] = {"layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim}
    if shape.is_mla:
        out |= {"kv_lora_rank": shape.kv_lora_rank, "rope_dim": shape.rope_dim}
    return out


def print_findings(console: Console, findings: Sequence[Finding]) -> None:
    """A plan's warnings under its table, each with its remedy (the JSON document has them as findings)."""
    for f in findings:
        console.print(f"{f.status.value.upper()}: {f.message}", highlight=False, markup=False)
        if f.remedy:
            console.print(f"  fix: {f.remedy}", highlight=False, markup=False)


def kv_table(rows: dict[str, Any], title: str) -> Table:
    table = Table(title=title, show_header=False)
    table.add_column("quantity", style="bold")
    table.add_column("value", justify="right")
    for key, value in rows.items():
        table.add_row(
            key,
            value if isinstance(value, str) else f"{value:,}" if isinstance(value, int) else f"{value:.6g}",
        )
    return table


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{n:,} B ({value:.2f} {unit})" if unit != "B" else f"{n:,} B"
        value /= 1024
    return f"{n:,} B"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:,.2f} ms" if s < 10 else f"{s:,.2f} s"
