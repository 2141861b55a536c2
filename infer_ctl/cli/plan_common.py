"""What the `inferctl plan` subcommands share: model-shape options, usage-error guard, table helpers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infer_ctl.core.findings import Finding
from infer_ctl.core.sizing import inputs, presets
from infer_ctl.core.sizing.inputs import InputError
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
            str(exc), remedy=exc.remedy if isinstance(exc, InputError)
            else "see the ranges in `inferctl plan <kv|spec|transfer|roofline|tiers|cost|pd> --help`"
        ) from None


def positive_options(**options: int | None) -> None:
    guard(inputs.positive_options, **options)


def finite_options(options: dict[str, float | None], command: str) -> None:
    """Float options must be finite: NaN passes every range test and crashes int(); inf, the same."""
    for flag, value in options.items():
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}", remedy=f"see `inferctl {command} --help`")


def tp_splits(shape: KvShape, tp: int, attention_heads: int | None) -> None:
    guard(inputs.tp_splits, shape, tp, attention_heads)


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
    """core.sizing.inputs.kv_shape, its input errors as usage errors."""
    return guard(inputs.kv_shape, model, layers, kv_heads, head_dim, kv_lora_rank, rope_dim, needed_by=needed_by)


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


def human_bytes(n: float | None) -> str:  # an int prints without decimals
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
