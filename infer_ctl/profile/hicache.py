"""`sglang.hicache`: SGLang's hierarchical KV cache (HiCache: GPU HBM, host DRAM, storage), per role.

Every field maps to one SGLang 0.5.23 flag, and only what is set is rendered (SGLang's own defaults apply
to the rest, `sglang/srt/arg_groups/fields/memory.py`). The rules below are the ones SGLang applies
later, on a GPU node, by refusing to start or by silently rewriting a setting; following the profile's
decision for speculative settings (docs/architecture.md), a rewrite is refused too, so what runs is
what the profile says. Rules that need the effective command line (extra args, page size) are judged
before launch in core/sglang/hicache_rules.py.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from infer_ctl.profile.base import StrictModel

HiCacheRole = Literal["prefill", "decode", "collocated"]
#: `--hicache-storage-backend` choices of SGLang 0.5.23 that run on NVIDIA GPU clusters; left out:
#: `npu_memcache` (Ascend NPU) and `sim` (SGLang's test backend)
StorageBackend = Literal[
    "file", "mooncake", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori", "shm", "tensorcast",
    "seaweedfs",
]  # fmt: skip
#: `--hicache-io-backend` without `kernel_ascend` (Ascend NPU only)
IoBackend = Literal["kernel", "direct"]
#: `--hicache-mem-layout` without `page_first_kv_split` (the Ascend MLA layout; CUDA host pools have no
#: copy path for it: `MHATokenToKVPoolHost.load_to_device_per_layer`, mem_cache/pool_host/mha.py)
MemLayout = Literal["layer_first", "page_first", "page_first_direct", "page_head"]
EvictionPolicy = Literal["lru", "lfu", "slru", "priority", "tlru"]
#: the keyword arguments each policy's strategy takes (`SLRUStrategy`, `TLRUStrategy` in
#: sglang/srt/mem_cache/evict_policy.py); SGLang fails at start-up on any other key
EVICTION_POLICY_KEYS: dict[str, tuple[str, ...]] = {
    "lru": (), "lfu": (), "priority": (), "slru": ("protected_threshold",),
    "tlru": ("threshold", "next_prompt_estimate"),
}  # fmt: skip


#: the host pool's size is one choice: a role block that sets any of these replaces the section's
SIZING_FIELDS = ("ratio", "size_gb", "host_memory_fraction")


class HiCacheStorage(StrictModel):
    """The L3 tier (`--hicache-storage-backend` and its companions)."""

    backend: StorageBackend
    #: `--hicache-storage-backend-extra-config`: a JSON object, or "@/path/on/the/nodes" (JSON/YAML/TOML)
    extra_config: dict[str, Any] | str | None = None
    #: `--hicache-storage-prefetch-policy` (SGLang's default: timeout)
    prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] | None = None

    @field_validator("extra_config")
    @classmethod
    def _file_on_the_nodes(cls, v: dict[str, Any] | str | None) -> dict[str, Any] | str | None:
        if isinstance(v, str) and not v.startswith("@/"):
            raise ValueError(f"a JSON object, or '@/absolute/path' of a JSON/YAML/TOML file on the nodes (got {v!r})")
        return v

    def extra_config_arg(self) -> str | None:
        if self.extra_config is None or isinstance(self.extra_config, str):
            return self.extra_config
        return json.dumps(self.extra_config, sort_keys=True, separators=(",", ":"))


class HiCacheSettings(StrictModel):
    """The fields a role may set for itself (`sglang.hicache.<role>`) over the section's."""

    #: `--hicache-host-memory-mode`: cache (host DRAM is a tier) or buffer_only (a staging buffer to storage)
    host_memory_mode: Literal["cache", "buffer_only"] | None = None
    #: `--hicache-ratio`: host pool / device pool (SGLang's default 2.0, 1.2 in buffer_only)
    ratio: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None  # inf: SGLang int(tokens x inf) fails
    #: `--hicache-size`: host pool in GB per rank (each TP rank allocates it); overrides the ratio
    size_gb: Annotated[int, Field(ge=1)] | None = None
    #: `--hicache-host-memory-fraction`: SGLang's auto-sizing share of host RAM (after a 10 GiB reserve)
    #: for all ranks of the server on a node; used only when neither ratio nor size_gb is set
    host_memory_fraction: Annotated[float, Field(gt=0, le=1)] | None = None
    write_policy: Literal["write_back", "write_through", "write_through_selective"] | None = None
    io_backend: IoBackend | None = None
    mem_layout: MemLayout | None = None
    storage: HiCacheStorage | None = None


class DecodeHiCache(HiCacheSettings):
    """HiCache on PD decodes, which SGLang runs without a radix cache unless told otherwise:
    - offload: `--disaggregation-decode-enable-offload-kvcache`, the decode writes finished requests'
      KV to the storage backend (needs `storage`);
    - radix: `--enable-hierarchical-cache --disaggregation-decode-enable-radix-cache`, a decode-side
      prefix cache with a host tier (EXPERIMENTAL in SGLang 0.5.23)."""

    mode: Literal["offload", "radix"]


def _default_roles() -> list[HiCacheRole]:
    return ["prefill", "collocated"]


class HiCache(HiCacheSettings):
    enable: bool = True
    #: the roles whose servers run HiCache; a decode needs `decode.mode`
    roles: list[HiCacheRole] = Field(default_factory=_default_roles, min_length=1)
    #: `--radix-eviction-policy` on these servers (pinned router prefixes need `priority`)
    eviction_policy: EvictionPolicy | None = None
    #: `--radix-eviction-policy-config` (slru: protected_threshold; tlru: threshold, next_prompt_estimate)
    eviction_policy_config: dict[str, int] | None = None
    #: `--enable-session-radix-cache`
    session_cache: bool = False
    #: the controller's environment variable holding the servers' --admin-api-key (given in extra args):
    #: `check servers` reads GET /hicache/storage-backend with it (SGLang answers it only with a key)
    admin_api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    prefill: HiCacheSettings | None = None
    decode: DecodeHiCache | None = None
    collocated: HiCacheSettings | None = None

    def settings_for(self, role: str) -> HiCacheSettings | None:
        """The effective settings of one role (the section's, with the role's own block over them), or
        None when the role runs no HiCache."""
        if not self.enable or role not in self.roles:
            return None
        own = getattr(self, role)
        fields = {k: getattr(self, k) for k in HiCacheSettings.model_fields}
        if own is not None:
            if own.model_fields_set & set(SIZING_FIELDS):  # a role's own sizing replaces the section's
                fields.update(dict.fromkeys(SIZING_FIELDS))
            fields.update({k: getattr(own, k) for k in own.model_fields_set if k in HiCacheSettings.model_fields})
        return HiCacheSettings(**fields)

    def decode_mode(self) -> str | None:
        return self.decode.mode if self.decode is not None and self.settings_for("decode") else None


Problem = tuple[tuple[str | int, ...], str]


def _settings_problems(loc: tuple[str | int, ...], s: HiCacheSettings, set_here: set[str]) -> list[Problem]:
    """Rules within one role's effective settings; `loc` + the field is blamed (the role block's own
    field when it set it, else the section's)."""

    def at(field: str) -> tuple[str | int, ...]:
        return (*loc, field) if field in set_here else ("sglang", "hicache", field)

    out: list[Problem] = []
    if s.host_memory_fraction is not None and (s.ratio is not None or s.size_gb is not None):
        # handle_hicache_ratio_default (arg_groups/hicache_hook.py) resolves the fraction to None then
        out.append((at("host_memory_fraction"), "SGLang ignores host_memory_fraction when ratio or size_gb is "
                    "set (an explicit size turns its auto-sizing off); set one of them"))
    if s.ratio is not None and s.size_gb is not None:
        out.append((at("ratio"), "size_gb overrides ratio in SGLang (--hicache-size wins); set one of them"))
    buffer_only = s.host_memory_mode == "buffer_only"
    if buffer_only and s.storage is None:
        out.append((at("host_memory_mode"), "buffer_only keeps no cache in host memory, only a staging buffer to "
                    "storage: SGLang refuses it without a storage backend (validate_hicache_host_memory_mode, "
                    "arg_groups/hicache_hook.py); set storage"))
    if buffer_only and s.write_policy == "write_back":
        out.append((at("write_policy"), "buffer_only has no host tier to write back to: SGLang rewrites write_back "
                    "to write_through (validate_hicache_host_memory_mode); set write_through"))
    io = s.io_backend or "kernel"  # SGLang's defaults: kernel, page_first
    layout = s.mem_layout or "page_first"
    # resolve_layout_io_compatibility (arg_groups/hicache_hook.py) rewrites these two combinations
    if layout == "page_first_direct" and io == "kernel":
        out.append((at("io_backend") if s.io_backend else at("mem_layout"),
                    "mem_layout page_first_direct with the kernel io backend: SGLang switches the io backend to "
                    "direct; set io_backend: direct"))
    if layout == "page_first" and io == "direct":
        out.append((at("mem_layout") if s.mem_layout else at("io_backend"),
                    "mem_layout page_first with the direct io backend: SGLang switches the layout to "
                    "page_first_direct; set mem_layout: page_first_direct (or layer_first)"))
    if layout == "page_head" and io == "direct":
        # the direct copy path has layer_first and page_first_direct only (load_to_device_per_layer,
        # mem_cache/pool_host/mha.py): "Unsupported layout" at the first load
        out.append((at("mem_layout"), "mem_layout page_head has no direct io path in SGLang (it fails at the first "
                    "host-to-device load); use io_backend: kernel, or mem_layout page_first_direct"))
    if s.storage is not None and s.storage.backend == "mooncake" and layout == "layer_first":
        # resolve_storage_layout_compatibility (arg_groups/hicache_hook.py)
        want = "page_first_direct" if io == "direct" else "page_first"
        out.append((at("mem_layout"), f"the mooncake storage backend does not support layer_first: SGLang switches "
                    f"to {want}; set mem_layout: {want}"))
    return out


def hicache_problems(
    hc: HiCache, *, collocated: bool, roles_present: set[str], pinned_prefixes: bool, spec_algorithm: str | None,
) -> list[Problem]:
    """The section's rules, with the path of the field to blame (profile.py reports them)."""
    base: tuple[str, ...] = ("sglang", "hicache")
    out: list[Problem] = []
    if "roles" in hc.model_fields_set:
        for j, role in enumerate(hc.roles):
            if role not in roles_present:
                runs = "a collocated profile runs collocated servers only" if collocated else (
                    "no node has this role" if role != "collocated" else "set `collocated: true` for plain servers")
                out.append(((*base, "roles", j), f"{role!r}: {runs}"))
    for role in ("prefill", "decode", "collocated"):
        if getattr(hc, role) is not None and role not in hc.roles:
            out.append(((*base, role), f"has no effect: {role!r} is not in sglang.hicache.roles"))
    if "decode" in hc.roles and hc.decode is None and "decode" in roles_present:
        out.append(((*base, "roles"), "a PD decode runs without a radix cache in SGLang, so HiCache there needs "
                    "decode.mode: offload (write finished KV to storage) or radix (an EXPERIMENTAL decode prefix "
                    "cache); without it SGLang refuses --enable-hierarchical-cache on the decode"))
    for role in hc.roles:
        s = hc.settings_for(role)
        if s is None or role not in roles_present:
            continue
        own = getattr(hc, role)
        out.extend(_settings_problems((*base, role), s, set(own.model_fields_set) if own is not None else set()))
        if role != "decode" or hc.decode is None:
            continue
        dloc = (*base, "decode")
        if s.host_memory_mode == "buffer_only":
            out.append(((*dloc, "host_memory_mode"), "SGLang refuses buffer_only on decode servers "
                        "(validate_hicache_host_memory_mode, arg_groups/hicache_hook.py)"))
        if hc.decode.mode == "offload" and s.storage is None:
            out.append(((*dloc, "mode"), "offload writes to the storage backend: SGLang refuses it without one "
                        "(handle_cache_compatibility, arg_groups/kv_cache_hook.py); set storage"))
        if hc.decode.mode == "offload" and s.storage is not None and isinstance(s.storage.extra_config, str):
            out.append(((*dloc, "storage", "extra_config"), "the decode's offload manager reads extra_config as inline "
                        "JSON only (DecodeKVCacheOffloadManager, disaggregation/decode_kvcache_offload_manager.py); "
                        "give the object itself"))
        if hc.decode.mode == "radix" and spec_algorithm not in (None, "EAGLE", "EAGLE3", "NEXTN"):
            out.append(((*dloc, "mode"), f"SGLang refuses the decode radix cache with speculative algorithm "
                        f"{spec_algorithm} (EAGLE/EAGLE3 only, arg_groups/speculative_hook.py)"))
    if hc.eviction_policy is not None:
        if pinned_prefixes and hc.eviction_policy != "priority":
            out.append(((*base, "eviction_policy"), f"router.prefixes pins prefixes, which only the priority policy "
                        f"keeps (they are warmed with a high priority); {hc.eviction_policy} would evict them"))
        allowed = EVICTION_POLICY_KEYS[hc.eviction_policy]
        for key in hc.eviction_policy_config or {}:
            if key not in allowed:
                takes = ", ".join(allowed) if allowed else "no parameters"
                out.append(((*base, "eviction_policy_config", key),
                            f"{hc.eviction_policy} takes {takes}; SGLang fails at start-up on {key!r}"))
        if hc.eviction_policy == "tlru":
            cfg = hc.eviction_policy_config or {}
            threshold, estimate = cfg.get("threshold", 0), cfg.get("next_prompt_estimate", 0)
            if threshold <= estimate or threshold < 0 or estimate < 0:
                out.append(((*base, "eviction_policy_config"), f"tlru needs threshold > next_prompt_estimate >= 0 "
                            f"(got {threshold} and {estimate}); SGLang refuses it otherwise "
                            "(handle_cache_compatibility, arg_groups/kv_cache_hook.py)"))
    elif hc.eviction_policy_config is not None:
        out.append(((*base, "eviction_policy_config"), "set eviction_policy (slru or tlru) to use a policy config"))
    return out
