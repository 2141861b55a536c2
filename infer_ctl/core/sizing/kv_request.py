"""`plan kv` from what it was given to its numbers: the shape (a preset or explicit dimensions), TP and
MTU (option, else the profile's, else the default), SGLang's mem_fraction_static (option, else SGLang
0.5.23's own rule), the KV capacity and the page alignment. The CLI (cli/plan_cmd.py) loads the profile,
calls `kv_outcome`, renders."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.alignment import DEFAULT_MTU, PageAlignment, kv_page_alignment
from infer_ctl.core.sizing.inputs import InputError, kv_shape, shape_dict, tp_splits
from infer_ctl.core.sizing.kv import KvPlan, capacity
from infer_ctl.core.sizing.sglang_memory import sglang_mem_fraction_static


@dataclass(frozen=True)
class KvRequest:
    """The options of `plan kv`, named as the flags (None: left out), and what a profile (-p) gives."""

    model: str | None
    layers: int | None
    kv_heads: int | None
    head_dim: int | None
    kv_lora_rank: int | None
    rope_dim: int | None
    dtype: str
    context: int
    hbm_gb: float | None
    weights_gb: float | None
    mem_fraction: float | None
    tp: int | None
    page_size: int
    mtu: int | None
    profile_mtu: int | None = None  # fabric.mtu of the profile given
    profile_tp: int | None = None  # models.target.tp of the profile given


@dataclass(frozen=True)
class MemFractionChoice:
    fraction: float
    source: str  # "--mem-fraction", or how SGLang's rule got it


@dataclass(frozen=True)
class KvOutcome:
    plan: KvPlan
    align: PageAlignment
    model_name: str | None
    is_mla: bool
    tp: int
    tp_source: str
    mtu: int
    mtu_source: str
    fraction: MemFractionChoice
    hbm_given: bool
    data: dict[str, Any]


def mem_fraction_choice(given: float | None, hbm: int | None, tp: int, mla: bool, model: str) -> MemFractionChoice:
    """--mem-fraction, else what SGLang 0.5.23 would pick for one GPU of this replica (--hbm-gb / TP)."""
    if given is not None:
        return MemFractionChoice(given, "--mem-fraction")
    if hbm is None:  # no memory, no budget: the fraction is not used
        return MemFractionChoice(1.0, "unused without --hbm-gb")
    rule = sglang_mem_fraction_static(hbm / tp, tp, mla=mla, model=model)
    return MemFractionChoice(rule.fraction, f"SGLang 0.5.23 default for {rule.gpu_mem_mib / 1024:,.1f} GiB per "
                                            f"GPU, TP {tp}: {rule.reserved_mib:,.0f} MiB kept back")


#: the path MTUs InfiniBand and RoCE know (IBTA: ibv_mtu 256..4096), as the profile's fabric.mtu
PATH_MTUS = (256, 512, 1024, 2048, 4096)


def kv_outcome(r: KvRequest) -> KvOutcome:
    """Resolve and plan; an impossible input raises ValueError (InputError: with its remedy)."""
    preset, shape = kv_shape(r.model, r.layers, r.kv_heads, r.head_dim, r.kv_lora_rank, r.rope_dim)
    dbytes = presets.dtype_bytes(r.dtype)
    weights = (int(r.weights_gb * 1e9) if r.weights_gb is not None
               else (preset.params * 2 if preset and r.hbm_gb else None))
    hbm = int(r.hbm_gb * 1e9) if r.hbm_gb is not None else None
    if r.mtu is not None and r.mtu not in PATH_MTUS:
        raise InputError(
            f"--mtu {r.mtu} is not an RDMA path MTU (one of {', '.join(map(str, PATH_MTUS))})",
            remedy="an Ethernet MTU such as 1500 or 9000 is the netdev's; RoCE over a 9000-byte netdev runs "
                   "path MTU 4096, over 1500 runs 1024",
        )
    mtu_source = "--mtu" if r.mtu is not None else "profile fabric.mtu" if r.profile_mtu is not None else "default"
    mtu = r.mtu if r.mtu is not None else (r.profile_mtu if r.profile_mtu is not None else DEFAULT_MTU)
    tp_source = "--tp" if r.tp is not None else "profile models.target.tp" if r.profile_tp is not None else "default"
    tp = r.tp if r.tp is not None else (r.profile_tp if r.profile_tp is not None else 1)
    tp_splits(shape, tp, preset.attention_heads if preset else None)
    fraction = mem_fraction_choice(r.mem_fraction, hbm, tp, shape.is_mla, preset.name if preset else "")
    plan = capacity(shape.bytes_per_token(dbytes), context=r.context, hbm_bytes=hbm, weights_bytes=weights,
                    mem_fraction=fraction.fraction)
    align = kv_page_alignment(shape, dbytes, tp=tp, page_size=r.page_size, mtu=mtu)
    data = {
        "model": preset.name if preset else None,
        "dtype": r.dtype,
        **shape_dict(shape),
        **asdict(plan),
        "tp": tp,
        "tp_source": tp_source,
        "mem_fraction": fraction.fraction,
        "mem_fraction_source": fraction.source,
        "mtu_source": mtu_source,
        "alignment": {**asdict(align), "aligned": align.aligned},
    }
    return KvOutcome(plan, align, preset.name if preset else None, shape.is_mla, tp, tp_source, mtu, mtu_source,
                     fraction, hbm is not None, data)
