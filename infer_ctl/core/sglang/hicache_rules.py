"""HiCache rules judged on the EFFECTIVE command lines (`launch.hicache`), before launch.

The profile refuses what its own `sglang.hicache` section gets wrong when it loads (profile/hicache.py);
these are the rules that need the whole command line: HiCache flags that extra args add or change, and
the flags HiCache depends on (`--page-size`, `--disable-radix-cache`, the decode's radix cache, the
speculative algorithm, the other servers on a node). A FAIL is a setting SGLang 0.5.23 refuses (at
start-up, minutes into a model load, or at the first host-to-device copy); a WARN is one it silently
rewrites, or a best practice it documents, with the reason. Each finding names the profile field to
change, or the extra args when they set the flag. Sources: sglang/srt/arg_groups/hicache_hook.py,
kv_cache_hook.py, pd_disaggregation_hook.py, speculative_hook.py, kv_shard_hook.py and the host pools
(mem_cache/pool_host/), SGLang 0.5.23; the HiCache best practices page
(https://docs.sglang.io/advanced_features/hicache_best_practices.html).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.hicache_argv import (
    DECODE_OFFLOAD_FLAG,
    DECODE_RADIX_FLAG,
    ENABLE_FLAG,
    EVICTION_FLAG,
    hicache_field_of,
    hicache_flags,
)
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.core.sizing.presets import model_preset
from infer_ctl.profile import Profile

CHECK = "launch.hicache"
Args = Mapping[str, str | None]

MODE = "--hicache-host-memory-mode"
RATIO = "--hicache-ratio"
SIZE = "--hicache-size"
FRACTION = "--hicache-host-memory-fraction"
WRITE = "--hicache-write-policy"
IO = "--hicache-io-backend"
LAYOUT = "--hicache-mem-layout"
STORAGE = "--hicache-storage-backend"
EXTRA = "--hicache-storage-backend-extra-config"
EVICTION_CONFIG = "--radix-eviction-policy-config"
SESSION = "--enable-session-radix-cache"
PAGE = "--page-size"
TRANSFER = "--disaggregation-transfer-backend"
RECEIVE = "--disaggregation-decode-host-receive-threshold"
#: SGLang's HiCache best practice with a storage backend: each page is one storage object (one key per
#: page and rank), so small pages mean many small I/Os
STORAGE_PAGE_SIZE = 64
#: SGLang's auto-sizing share of host RAM when neither ratio nor size is given (the flag's default)
DEFAULT_FRACTION = 0.8
#: Ascend NPU values of the choices (hardware_backend/npu/utils.py sets them there); the CUDA host
#: pools have no copy path for them
NPU_ONLY = {IO: "kernel_ascend", LAYOUT: "page_first_kv_split", STORAGE: "npu_memcache"}


def _float(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


class _Judge:
    """One instance: its effective args, and the name of the place that sets each flag."""

    def __init__(self, profile: Profile, inst: Instance, args: Args) -> None:
        self.profile, self.inst, self.args = profile, inst, args
        self.rendered = dict(hicache_flags(profile, inst.role))
        self.out: list[Finding] = []

    def where(self, flag: str) -> str:
        """The profile field that renders `flag` with the value that runs, else the extra args."""
        if flag in self.rendered and self.args.get(flag) == self.rendered[flag]:
            field = hicache_field_of(self.profile, self.inst.role, flag)
            if field:
                return field
        if flag not in self.args:
            return f"{flag} (unset; set it in sglang.extra_args.{self.inst.role})"
        return f"{flag} in the extra args (sglang.extra_args.{self.inst.role} / nodes[].overrides.extra_args)"

    def add(self, status: str, flag: str, message: str, remedy: str) -> None:
        field = self.where(flag)
        make = Finding.fail if status == "fail" else Finding.warn
        self.out.append(make(CHECK, self.inst.node, self.inst.name, f"{field}: {message}",
                             details={"field": field, "flag": flag, "value": self.args.get(flag)}, remedy=remedy))


def _instance_findings(profile: Profile, inst: Instance, args: Args) -> list[Finding]:
    j = _Judge(profile, inst, args)
    has = args.__contains__
    hicache, offload = has(ENABLE_FLAG), has(DECODE_OFFLOAD_FLAG)
    mode = args.get("--disaggregation-mode") or "null"
    _page_size(j)
    _eviction(j)
    if not (hicache or offload):
        return j.out
    storage = args.get(STORAGE)
    buffer_only = args.get(MODE) == "buffer_only"
    if hicache and has("--disable-radix-cache"):
        j.add("fail", "--disable-radix-cache", "HiCache with --disable-radix-cache: SGLang refuses the pair "
              "(handle_cache_compatibility, kv_cache_hook.py)", "drop --disable-radix-cache, or HiCache on this role")
    if hicache and mode == "decode" and not has(DECODE_RADIX_FLAG):
        j.add("fail", ENABLE_FLAG, "SGLang runs PD decodes without a radix cache (handle_pd_disaggregation), and "
              "then refuses --enable-hierarchical-cache (handle_cache_compatibility)",
              "set sglang.hicache.decode.mode (radix adds --disaggregation-decode-enable-radix-cache; offload "
              "writes to storage instead)")
    if buffer_only and storage is None:
        j.add("fail", MODE, "buffer_only without a storage backend: SGLang refuses it "
              "(validate_hicache_host_memory_mode, hicache_hook.py)", "set a storage backend, or host_memory_mode cache")
    if buffer_only and mode == "decode":
        j.add("fail", MODE, "SGLang refuses buffer_only on decode servers (validate_hicache_host_memory_mode)",
              "use host_memory_mode cache on decodes")
    if offload:
        _offload(j, mode, storage)
    for other, what in (("--enable-lmcache", "LMCache"), ("--enable-unified-cache-external-linker",
                                                           "the unified cache external linker")):
        if hicache and has(other):
            j.add("fail", other, f"{what} and HiCache are mutually exclusive in SGLang (kv_cache_hook.py / "
                  "hicache_hook.py)", f"drop {other} or HiCache")
    for flag, value in NPU_ONLY.items():
        if args.get(flag) == value:
            j.add("fail", flag, f"{value} is SGLang's Ascend NPU choice; the CUDA host pools have no copy path for "
                  "it (mem_cache/pool_host/)", "leave it unset (SGLang's CUDA default) or choose a CUDA value")
    _layout(j)
    _sizing(j)
    if hicache:
        _dcp(j, storage, buffer_only)
    _compat(j, mode, storage, hicache)
    if storage is not None and (_float(args.get(PAGE)) or 1) < STORAGE_PAGE_SIZE:
        page = args.get(PAGE)
        j.add("warn", PAGE, f"page size {page or '1 (SGLang default)'} with storage backend {storage}: each page "
              "is one storage object per rank, so small pages mean many small storage I/Os; SGLang's HiCache best "
              f"practices use --page-size {STORAGE_PAGE_SIZE}",
              f"set --page-size {STORAGE_PAGE_SIZE} on prefill and decode alike (they must agree)")
    if mode == "decode" and hicache and has(DECODE_RADIX_FLAG):
        j.add("warn", DECODE_RADIX_FLAG, "the decode radix cache is EXPERIMENTAL in SGLang 0.5.23 "
              "(handle_pd_disaggregation logs so)", "watch the decode's hit rate and errors after enabling it")
        _decode_radix(j, storage)
    return j.out


def _decode_radix(j: _Judge, storage: str | None) -> None:
    """The decode radix cache's own refusals (handle_pd_disaggregation, pd_disaggregation_hook.py:98-108),
    and the layer_first host pool that decode host receive shares with HiCache (handle_hicache,
    hicache_hook.py:74-94)."""
    if "--enable-hisparse" in j.args:
        j.add("fail", "--enable-hisparse", "SGLang refuses the decode radix cache with --enable-hisparse "
              "(handle_pd_disaggregation)", "drop --enable-hisparse or the decode radix cache")
    if j.args.get(TRANSFER) == "fake":
        j.add("fail", TRANSFER, "SGLang refuses the decode radix cache with the fake transfer backend "
              "(handle_pd_disaggregation)", "use a real transfer backend, or no decode radix cache")
    if not _host_receive(j.args):
        return
    if storage in ("mooncake", "npu_memcache"):
        j.add("fail", STORAGE, f"decode host receive (--disaggregation-decode-host-receive-threshold < 1) needs the "
              f"layer_first host layout, which SGLang switches away from for {storage}, then refuses ('cannot share "
              "the layer_first decode host pool used by KV transfer', handle_hicache)",
              "drop the host receive threshold on the decodes, or use another storage backend there")
    elif (j.args.get(LAYOUT) or "page_first") != "layer_first":
        j.add("warn", LAYOUT if LAYOUT in j.args else RECEIVE, "decode host receive "
              "(--disaggregation-decode-host-receive-threshold < 1) shares its layer_first host pool with HiCache: "
              "SGLang switches the layout to layer_first (handle_hicache)", f"set {LAYOUT} layer_first on the decodes")


def _host_receive(args: Args) -> bool:
    """--disaggregation-decode-host-receive-threshold below 1 (SGLang's default 1.0: off)."""
    threshold = _float(args.get(RECEIVE))
    return threshold is not None and threshold < 1


def _page_size(j: _Judge) -> None:
    """Every server, HiCache or not: --page-size must be a positive integer. SGLang's parser takes any int
    and nothing checks the sign (0 trips an assertion in cuda_graph_hook.py, a negative size breaks the
    allocators); the KV page checks (launch.kv_page) cannot judge it either, so it is their FAIL."""
    if PAGE not in j.args:
        return
    value = j.args.get(PAGE)
    try:
        page = int(value) if value is not None else None
    except ValueError:
        page = None
    if page is not None and page >= 1:
        return
    field = j.where(PAGE)
    j.out.append(Finding.fail(
        "launch.kv_page", j.inst.node, j.inst.name,
        f"{field}: --page-size {value!s} is not a positive integer (SGLang's parser refuses a non-integer; 0 or "
        "a negative size it does not check, and fails later: an assertion in cuda_graph_hook.py, broken KV "
        "allocators)",
        details={"field": field, "flag": PAGE, "value": value},
        remedy="set --page-size to a positive integer on prefill and decode alike (64 with HiCache storage; "
        "`inferctl plan kv --page-size N` shows its alignment)"))  # fmt: skip


def _eviction(j: _Judge) -> None:
    policy = j.args.get(EVICTION_FLAG)
    if policy != "tlru":
        return
    try:
        cfg = json.loads(j.args.get(EVICTION_CONFIG) or "{}")
    except ValueError:
        cfg = {}
    threshold = cfg.get("threshold", 0) if isinstance(cfg, dict) else 0
    estimate = cfg.get("next_prompt_estimate", 0) if isinstance(cfg, dict) else 0
    if not (isinstance(threshold, int) and isinstance(estimate, int)) or threshold <= estimate or estimate < 0:
        j.add("fail", EVICTION_FLAG, f"tlru needs threshold > next_prompt_estimate >= 0 in {EVICTION_CONFIG} "
              f"(got {threshold} and {estimate}); SGLang refuses it (handle_cache_compatibility)",
              "set sglang.hicache.eviction_policy_config {threshold: N, next_prompt_estimate: M} with N > M")


def _offload(j: _Judge, mode: str, storage: str | None) -> None:
    if mode != "decode":
        j.add("fail", DECODE_OFFLOAD_FLAG, "decode KV offload on a server that is not a PD decode: SGLang refuses "
              "it (handle_cache_compatibility)", "drop it, or use HiCache (--enable-hierarchical-cache) here")
    if storage is None:
        j.add("fail", DECODE_OFFLOAD_FLAG, "decode KV offload without a storage backend: SGLang refuses it "
              "(handle_cache_compatibility)", "set sglang.hicache.decode.storage (or the section's storage)")
    if j.args.get("--disaggregation-decode-retraction-backup") == "host_pool":
        j.add("fail", "--disaggregation-decode-retraction-backup", "host_pool retraction and decode KV offload "
              "both build a decode host pool; SGLang refuses the pair (handle_cache_compatibility)",
              "drop --disaggregation-decode-retraction-backup host_pool")
    elif _host_receive(j.args):
        j.add("fail", RECEIVE, "decode host receive (a threshold below 1) makes SGLang use host_pool retraction "
              "(handle_pd_disaggregation), which decode KV offload refuses: both build a decode host pool "
              "(handle_cache_compatibility)", "drop the host receive threshold on offloading decodes")
    if (j.args.get(EXTRA) or "").startswith("@"):
        j.add("fail", EXTRA, "the decode's offload manager reads the extra config as inline JSON only "
              "(DecodeKVCacheOffloadManager, disaggregation/decode_kvcache_offload_manager.py)",
              "give the JSON object itself")


def _layout(j: _Judge) -> None:
    """resolve_layout_io_compatibility / resolve_storage_layout_compatibility rewrite these (WARN: what
    runs is not what was asked); page_head has no direct path (FAIL)."""
    io, layout = j.args.get(IO) or "kernel", j.args.get(LAYOUT) or "page_first"
    if layout == "page_first_direct" and io == "kernel":
        j.add("warn", IO if IO in j.args else LAYOUT, "page_first_direct with the kernel io backend: SGLang "
              "switches the io backend to direct (resolve_layout_io_compatibility)", f"set {IO} direct")
    if layout == "page_first" and io == "direct":
        j.add("warn", LAYOUT if LAYOUT in j.args else IO, "page_first with the direct io backend: SGLang switches "
              "the layout to page_first_direct (resolve_layout_io_compatibility)", f"set {LAYOUT} page_first_direct")
    if layout == "page_head" and io == "direct":
        j.add("fail", LAYOUT, "page_head has no direct io copy path in SGLang (load_to_device_per_layer raises "
              "'Unsupported layout' at the first host-to-device load)", f"use {IO} kernel or {LAYOUT} page_first_direct")
    if layout == "page_head" and _model_is_mla(j.profile):
        j.add("fail", LAYOUT, "page_head is an MHA layout; SGLang's MLA host pool has no copy path for it "
              "(MLATokenToKVPoolHost, mem_cache/pool_host/mla.py)", f"use {LAYOUT} page_first or layer_first")
    if j.args.get(STORAGE) == "mooncake" and layout == "layer_first":
        want = "page_first_direct" if io == "direct" else "page_first"
        j.add("warn", LAYOUT, f"the mooncake storage backend does not support layer_first: SGLang switches to {want} "
              "(resolve_storage_layout_compatibility)", f"set {LAYOUT} {want}")
    if j.args.get(MODE) == "buffer_only" and j.args.get(WRITE) == "write_back":
        j.add("warn", WRITE, "buffer_only has no host tier to write back to: SGLang rewrites write_back to "
              "write_through (validate_hicache_host_memory_mode)", f"set {WRITE} write_through")


def _dcp(j: _Judge, storage: str | None, buffer_only: bool) -> None:
    """HiCache with decode context parallelism (--dcp-size > 1): resolve_hicache_dcp_compatibility
    (hicache_hook.py) refuses what has no DCP index translation."""
    try:
        dcp = int(j.args.get("--dcp-size") or 1)
    except ValueError:
        return
    if dcp <= 1:
        return
    why = "SGLang refuses it (resolve_hicache_dcp_compatibility, hicache_hook.py)"
    if storage is not None and buffer_only:
        j.add("fail", MODE, f"HiCache storage with --dcp-size {dcp} does not support buffer_only host memory: {why}",
              "use host_memory_mode cache, or --dcp-size 1")
    algo = j.args.get("--speculative-algorithm")
    if algo is not None and algo.upper() != "DSPARK":
        j.add("fail", "--speculative-algorithm", f"HiCache with --dcp-size {dcp} supports DSPARK drafts only (other "
              f"draft host pools have no DCP index translation): {why}", "use DSPARK, no draft, or --dcp-size 1")
    if "--enable-hisparse" in j.args:
        j.add("fail", "--enable-hisparse", f"--enable-hisparse with --dcp-size {dcp} and HiCache: {why}",
              "drop --enable-hisparse or --dcp-size")
    target = j.profile.models.target if j.profile.models else None
    if target is not None and target.preset and not _model_is_mla(j.profile):
        j.add("fail", "--dcp-size", f"HiCache with --dcp-size {dcp} works for MLA models only ({target.preset} is not "
              f"one: the MHA host pool has no DCP index translation): {why}", "use --dcp-size 1 with HiCache")


def _model_is_mla(profile: Profile) -> bool:
    target = profile.models.target if profile.models else None
    if target is None or not target.preset:
        return False
    try:
        return model_preset(target.preset).is_mla
    except ValueError:
        return False


def _sizing(j: _Judge) -> None:
    fraction, ratio, size = _float(j.args.get(FRACTION)), _float(j.args.get(RATIO)), _float(j.args.get(SIZE))
    if fraction is not None and not 0 < fraction <= 1:
        j.add("fail", FRACTION, f"{fraction} is outside (0, 1]; SGLang refuses it (handle_hicache_ratio_default)",
              "give a fraction in (0, 1]")
    if ratio is not None and not (math.isfinite(ratio) and ratio > 0):
        # SGLang's parser takes any float; the host pool is int(device tokens x ratio) (pool_host/base.py)
        j.add("fail", RATIO, f"--hicache-ratio {j.args.get(RATIO)} is not a positive finite number: SGLang sizes the "
              "host pool as int(device tokens x ratio), which fails (nan, inf) or holds nothing (<= 0)",
              "give a ratio above 1 (SGLang's default is 2), or size_gb")
        ratio = None  # judged: no "ratio <= 1" warning on top
    explicit = (ratio is not None) or bool(size)
    if FRACTION in j.args and explicit:
        j.add("warn", FRACTION, "ignored: an explicit --hicache-ratio or --hicache-size turns SGLang's auto-sizing "
              "off (handle_hicache_ratio_default)", "set one way of sizing the host pool")
    if ratio is not None and not size and ratio <= 1:
        j.add("warn", RATIO, f"ratio {ratio:g}: the host pool is not larger than the device pool, so it holds "
              "little the GPU does not (SGLang warns 'L2 cache effectiveness is reduced', HostKVCache, "
              "mem_cache/pool_host/base.py)", "raise the ratio above 1 (SGLang's default is 2), or size_gb")


def _compat(j: _Judge, mode: str, storage: str | None, hicache: bool) -> None:
    args = j.args
    algo = (args.get("--speculative-algorithm") or "").upper()
    if mode == "decode" and DECODE_RADIX_FLAG in args and algo not in ("", "EAGLE", "EAGLE3", "NEXTN", "DSPARK"):
        j.add("fail", DECODE_RADIX_FLAG, f"SGLang refuses the decode radix cache with --speculative-algorithm {algo} "
              "(EAGLE, EAGLE3, DSPARK only: speculative_hook.py)", "drop the decode radix cache or change the draft")
    if "--enable-kv-cache-sharding" in args:
        if hicache and storage is not None:
            j.add("fail", STORAGE, "--enable-kv-cache-sharding supports HiCache host offload but not a storage "
                  "backend (kv_shard_hook.py)", "drop the storage backend or the KV cache sharding")
        if SESSION in args:
            j.add("fail", SESSION, "--enable-kv-cache-sharding does not support the session radix cache "
                  "(kv_shard_hook.py)", "drop one of them")
    if args.get("--disaggregation-decode-allocation-policy") == "prefill_complete" and hicache:
        bad = (mode == "decode") or (mode == "prefill" and (storage is not None or args.get(WRITE) != "write_back"))
        if bad:
            what = "decode HiCache" if mode == "decode" else "prefill HiCache other than L2 write_back"
            j.add("fail", ENABLE_FLAG, f"--disaggregation-decode-allocation-policy prefill_complete does not "
                  f"support {what} (_validate_prefill_complete, pd_disaggregation_hook.py)",
                  "use write_policy write_back without storage on prefills and no decode HiCache, or another "
                  "allocation policy")


def _node_findings(profile: Profile, every: list[Instance], chosen_names: set[str],
                   args: Mapping[str, Args]) -> list[Finding]:
    """Servers on one node that each auto-size their host pools (no ratio, no size): SGLang sizes each
    against the host memory it sees (cgroup-bounded, less a 10 GiB reserve) times its own fraction,
    unaware of the other server, so fractions adding up past 1 over-commit host RAM ("Lower it when
    several engines share a memory cgroup": the flag's help, arg_groups/fields/memory.py)."""
    by_node: dict[str, list[tuple[Instance, float]]] = {}
    for inst in every:
        a = args[inst.name]
        if not inst.is_leader or not (ENABLE_FLAG in a or DECODE_OFFLOAD_FLAG in a):
            continue
        if a.get(RATIO) is not None or (_float(a.get(SIZE)) or 0) > 0:
            continue
        if inst.role == "decode" and ENABLE_FLAG not in a:
            continue  # a decode's offload pool defaults to a ratio, not auto-sizing
        by_node.setdefault(inst.node, []).append((inst, _float(a.get(FRACTION)) or DEFAULT_FRACTION))
    out: list[Finding] = []
    for node, servers in by_node.items():
        total = sum(f for _, f in servers)
        if len(servers) < 2 or total <= 1:
            continue
        for inst, fraction in servers:
            if inst.name not in chosen_names:
                continue
            others = ", ".join(i.name for i, _ in servers if i is not inst)
            out.append(Finding.warn(
                CHECK, node, inst.name,
                f"sglang.hicache.host_memory_fraction: {inst.name} auto-sizes its host pool to {fraction:g} of the "
                f"node's memory and so does {others} (together {total:g}): SGLang sizes each server on its own, "
                "so they over-commit host RAM",
                details={"field": "sglang.hicache.host_memory_fraction", "servers": [i.name for i, _ in servers],
                         "total_fraction": total},
                remedy="give each role its share (sglang.hicache.<role>.host_memory_fraction, summing to <= 1), "
                "or size the pools with ratio / size_gb"))  # fmt: skip
    return out


def hicache_findings(profile: Profile, every: list[Instance], chosen: list[Instance],
                     args: Mapping[str, Args]) -> list[Finding]:
    """`launch.hicache` findings of the chosen instances (args: each instance's effective flags)."""
    out: list[Finding] = []
    for inst in chosen:
        out.extend(_instance_findings(profile, inst, args[inst.name]))
    out.extend(_node_findings(profile, every, {i.name for i in chosen}, args))
    return out


def cache_compatibility_error(cfg: Mapping[str, Any]) -> str | None:
    """The HiCache rules of SGLang 0.5.23's `handle_cache_compatibility` (arg_groups/kv_cache_hook.py,
    lines 351-469), reproduced in its order with its messages, on a record its earlier hooks resolved:
    `launch --check-args` runs those hooks as SGLang's own functions (launch/argcheck.py) and then this,
    because kv_cache_hook.py imports sglang.srt.configs, which needs transformers (not in the `sglang`
    extra). Judging the RESOLVED record is the point: `handle_pd_disaggregation` turns the radix cache off
    on a PD decode, after which `--enable-hierarchical-cache` there is refused (line 393). None: passes."""
    retraction = cfg.get("disaggregation_decode_retraction_backup")
    mode = cfg.get("disaggregation_mode")
    if retraction == "host_pool" and mode != "decode":  # kv_cache_hook.py:353
        return "--disaggregation-decode-retraction-backup=host_pool is only supported on a PD decode server."
    if cfg.get("radix_eviction_policy") == "tlru":  # kv_cache_hook.py:375
        tlru = cfg.get("radix_eviction_policy_config") or {}
        threshold, estimate = tlru.get("threshold", 0), tlru.get("next_prompt_estimate", 0)
        if threshold < 0 or estimate < 0:
            return ("--radix-eviction-policy tlru requires non-negative 'threshold' and 'next_prompt_estimate' in "
                    f"--radix-eviction-policy-config, got {threshold} and {estimate}.")
        if threshold <= estimate:
            return ("--radix-eviction-policy tlru needs 'threshold' greater than 'next_prompt_estimate' in "
                    f"--radix-eviction-policy-config, got {threshold} <= {estimate}; otherwise no tokens are ever "
                    "TEL-safe and T-LRU is exactly LRU.")
    if cfg.get("enable_hierarchical_cache") and cfg.get("disable_radix_cache"):  # kv_cache_hook.py:393
        return ("The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot "
                "be used at the same time. Please use only one of them.")
    if cfg.get("disaggregation_decode_enable_offload_kvcache"):  # kv_cache_hook.py:399
        if mode != "decode":
            return "The argument disaggregation-decode-enable-offload-kvcache is only supported for decode side."
        if cfg.get("hicache_storage_backend") is None:
            return ("The argument disaggregation-decode-enable-offload-kvcache is only supported when "
                    "hicache-storage-backend is provided.")
        if retraction == "host_pool":
            return ("The arguments disaggregation-decode-enable-offload-kvcache and "
                    "disaggregation-decode-retraction-backup=host_pool are mutually exclusive: both build a decode "
                    "host pool.")
    if cfg.get("enable_lmcache"):  # kv_cache_hook.py:433
        if cfg.get("enable_hierarchical_cache"):
            return "--enable-lmcache and --enable-hierarchical-cache are mutually exclusive"
        if cfg.get("hicache_host_memory_mode") == "buffer_only":  # kv_cache_hook.py:466
            return "--hicache-host-memory-mode=buffer_only is a HiCache-only mode"
    return None
