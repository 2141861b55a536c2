"""Does each server's KV page fill whole RDMA packets and cache lines (`launch.kv_page`)?

The checklist's KV fragmentation bound, judged on the effective command lines with
core/sizing/alignment.py (the math, and why a page of one layer on one rank is the unit, is there):
`profile validate` and `launch --dry-run` WARN when a page ends mid-packet (fabric.mtu, per node) or
mid cache line, and name the page sizes that would not. Prefill and decode servers move pages over the
fabric (PD transfer), so both bounds apply; a collocated server moves pages only between HBM and host
memory (HiCache), so only the cache line does. The model's shape comes from `models.target.preset`, or
from the model's config.json when the caller could read it; without either the check says it cannot
judge (SKIP). A page size that differs between prefill and decode is `launch.pd_agreement`'s FAIL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.argv import build_argv
from infer_ctl.core.sglang.consistency import effective_args
from infer_ctl.core.sglang.instance import Instance, instances
from infer_ctl.core.sizing.alignment import CACHE_LINE_BYTES, PageAlignment, page_alignment
from infer_ctl.core.sizing.kv import KvShape, shape_of
from infer_ctl.core.sizing.presets import model_preset
from infer_ctl.profile import Profile

CHECK = "launch.kv_page"
#: SGLang 0.5.23's page size when --page-size is unset on CUDA (`_page_size_default`,
#: sglang/srt/arg_groups/overrides.py; some attention backends set their own, e.g. trtllm_mha, flashmla)
SGLANG_DEFAULT_PAGE = 1
#: --kv-cache-dtype -> bytes per element (auto: the model's dtype); the fp4 formats are sub-byte with
#: separate scales, so a page's bytes are not page x row x a whole number
KV_DTYPE_BYTES: dict[str, int] = {"fp8_e5m2": 1, "fp8_e4m3": 1, "mxfp8": 1, "bf16": 2, "bfloat16": 2}
#: config.json torch_dtype -> bytes (what --kv-cache-dtype auto stores)
MODEL_DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    shape: KvShape | None
    source: str  # where it came from, or why there is none
    dtype_bytes: int | None = None  # the model's own dtype (config.json), for --kv-cache-dtype auto


def shape_from_config(cfg: Mapping[str, Any]) -> KvShape | None:
    """A Hugging Face config.json's KV shape (the fields SGLang's ModelConfig reads), None when it lacks
    them. MLA when it has kv_lora_rank."""
    cfg = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), Mapping) else cfg
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        if cfg.get("kv_lora_rank"):
            return KvShape(layers, heads, int(cfg.get("v_head_dim") or 0) or 1, int(cfg["kv_lora_rank"]),
                           int(cfg.get("qk_rope_head_dim") or 0))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return KvShape(layers, kv_heads, head_dim)


def model_shape(profile: Profile, config: Mapping[str, Any] | None = None) -> ModelShape:
    """The target model's KV shape: its preset, else its config.json (read by the caller), else why not."""
    target = profile.models.target if profile.models else None
    if target is None:
        return ModelShape(None, "the profile has no models section")
    if target.preset:
        try:
            return ModelShape(shape_of(model_preset(target.preset)), f"preset {target.preset}")
        except ValueError as exc:
            return ModelShape(None, str(exc))
    if config is not None:
        shape = shape_from_config(config)
        dtype = MODEL_DTYPE_BYTES.get(str(config.get("torch_dtype") or ""))
        if shape is not None:
            return ModelShape(shape, f"{target.path}/config.json", dtype)
        return ModelShape(None, f"{target.path}/config.json has no num_hidden_layers / num_attention_heads")
    return ModelShape(None, f"models.target.preset is not set and {target.path}/config.json is not readable here")


def _dtype_bytes(kv_dtype: str, model: ModelShape) -> tuple[int | None, str]:
    if kv_dtype == "auto":
        if model.dtype_bytes is not None:
            return model.dtype_bytes, "auto (the model's dtype)"
        return 2, "auto (taken as bf16, the usual checkpoint dtype)"
    return KV_DTYPE_BYTES.get(kv_dtype), kv_dtype


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _message(a: PageAlignment, what: str, fabric: bool) -> str:
    parts = []
    if fabric and not a.fills_mtu:
        parts.append(f"ends {a.last_packet_bytes:,} B into its last {a.mtu:,}-byte MTU packet "
                     f"({a.packets:,} packet{'s' if a.packets != 1 else ''}; whole packets from page size "
                     f"{a.min_page_for_mtu} on)")
    if not a.fills_cache_lines:
        parts.append(f"ends mid {a.cache_line}-byte cache line (whole lines from page size "
                     f"{a.min_page_for_cache_line} on)")
    return f"KV page {a.page_size} x {a.row_bytes:,} B = {a.page_bytes:,} B ({what}) " + " and ".join(parts)


def kv_page_findings(
    profile: Profile, selected: list[Instance] | None = None, *, config: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """WARN per group of servers sharing a misaligned page; SKIP when the page cannot be judged."""
    chosen = [i for i in (selected if selected is not None else instances(profile)) if i.is_leader]
    if not chosen:
        return []
    model = model_shape(profile, config)
    if model.shape is None:
        return [Finding.skip(CHECK, "-", "kv page", f"KV page alignment not judged: {model.source}",
                             remedy="set models.target.preset (`inferctl plan kv --list-presets`), then "
                             "`inferctl plan kv -p PROFILE --page-size N` shows the page")]
    groups: dict[tuple[int, int, int, bool], list[Instance]] = {}
    labels: dict[tuple[int, int, int, bool], str] = {}
    out: list[Finding] = []
    for inst in chosen:
        args = effective_args(build_argv(profile, inst).argv)
        kv_dtype = args.get("--kv-cache-dtype") or "auto"
        dbytes, dtype_label = _dtype_bytes(kv_dtype, model)
        if dbytes is None:
            out.append(Finding.skip(CHECK, inst.node, inst.name, f"KV page alignment not judged: --kv-cache-dtype "
                                    f"{kv_dtype} is sub-byte with separate scales"))
            continue
        page = _int(args.get("--page-size")) if "--page-size" in args else SGLANG_DEFAULT_PAGE
        if page is None or page < 1:
            continue  # not a positive integer: launch_problems' launch.kv_page FAIL (hicache_rules._page_size)
        fabric = inst.role in ("prefill", "decode")
        node_mtu: int = profile.fabric_policy_for(profile.node(inst.node)).mtu
        row = model.shape.row_bytes(dbytes, inst.tp)
        key = (page, row, node_mtu if fabric else 0, fabric)
        groups.setdefault(key, []).append(inst)
        kind = "latent" if model.shape.is_mla else "K or V"
        labels[key] = f"one layer's {kind} row on one of TP {inst.tp} ranks, {model.source}, KV dtype {dtype_label}"
    for (page, row, mtu, fabric), insts in groups.items():
        a = page_alignment(row, page, mtu=mtu or 4096, cache_line=CACHE_LINE_BYTES)
        if (a.fills_mtu or not fabric) and a.fills_cache_lines:
            continue
        need = a.min_aligned_page if fabric else a.min_page_for_cache_line
        sizes = [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256) if p % need == 0] or [need]
        roles = sorted({i.role for i in insts}, key=("prefill", "decode", "collocated").index)
        page_src = ("--page-size unset: SGLang 0.5.23 uses 1 on CUDA" if all(
            effective_args(build_argv(profile, i).argv).get("--page-size") is None for i in insts)
            else f"--page-size {page}")
        nodes = sorted({i.node for i in insts})
        out.append(Finding.warn(
            CHECK, nodes[0] if len(nodes) == 1 else "-", "+".join(roles),
            f"{_message(a, labels[(page, row, mtu, fabric)], fabric)} ({page_src}); page sizes that fill "
            f"{'whole packets and ' if fabric else ''}cache lines: {', '.join(map(str, sizes))}",
            details={"page_size": page, "row_bytes": row, "page_bytes": a.page_bytes, "mtu": mtu or None,
                     "cache_line": a.cache_line, "fills_mtu": a.fills_mtu if fabric else None,
                     "fills_cache_lines": a.fills_cache_lines, "aligned_page_sizes": sizes,
                     "instances": [i.name for i in insts]},
            remedy=f"set --page-size {sizes[0]} (64 with a HiCache storage backend) in sglang.extra_args"
            + (" of prefill and decode alike (they must agree)" if fabric else ".collocated"),
        ))  # fmt: skip
    return out
