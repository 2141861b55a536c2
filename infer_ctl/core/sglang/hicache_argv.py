"""The SGLang 0.5.23 flags of `sglang.hicache` for one server (profile/hicache.py says what each means).

Only what the profile sets is rendered; SGLang's defaults apply to the rest. Which flags a role gets:
- prefill, collocated: `--enable-hierarchical-cache` and the host/storage settings;
- decode, mode radix: the same plus `--disaggregation-decode-enable-radix-cache` (SGLang disables the
  radix cache on PD decodes otherwise, and then refuses HiCache: `handle_pd_disaggregation`,
  arg_groups/pd_disaggregation_hook.py, then `handle_cache_compatibility`, arg_groups/kv_cache_hook.py);
- decode, mode offload: `--disaggregation-decode-enable-offload-kvcache` with the storage settings and no
  `--enable-hierarchical-cache` (the offload manager builds its own host pool; there is no radix tree
  to evict from, so the eviction policy and session cache are not rendered there).
"""

from __future__ import annotations

import json

from infer_ctl.profile import Profile
from infer_ctl.profile.hicache import HiCacheSettings

#: (flag, value); value None is a switch
FlagValue = tuple[str, str | None]

ENABLE_FLAG = "--enable-hierarchical-cache"
DECODE_RADIX_FLAG = "--disaggregation-decode-enable-radix-cache"
DECODE_OFFLOAD_FLAG = "--disaggregation-decode-enable-offload-kvcache"
EVICTION_FLAG = "--radix-eviction-policy"

#: profile field (of HiCacheSettings) -> SGLang flag
SETTING_FLAGS: dict[str, str] = {
    "host_memory_mode": "--hicache-host-memory-mode",
    "ratio": "--hicache-ratio",
    "size_gb": "--hicache-size",
    "host_memory_fraction": "--hicache-host-memory-fraction",
    "write_policy": "--hicache-write-policy",
    "io_backend": "--hicache-io-backend",
    "mem_layout": "--hicache-mem-layout",
}
STORAGE_FLAGS: dict[str, str] = {
    "backend": "--hicache-storage-backend",
    "extra_config": "--hicache-storage-backend-extra-config",
    "prefetch_policy": "--hicache-storage-prefetch-policy",
}
SECTION_FLAGS: dict[str, str] = {
    "eviction_policy": EVICTION_FLAG,
    "eviction_policy_config": "--radix-eviction-policy-config",
    "session_cache": "--enable-session-radix-cache",
}


def _settings_flags(s: HiCacheSettings) -> list[FlagValue]:
    out: list[FlagValue] = []
    for field, flag in SETTING_FLAGS.items():
        value = getattr(s, field)
        if value is not None:
            out.append((flag, str(value)))
    if s.storage is not None:
        out.append((STORAGE_FLAGS["backend"], s.storage.backend))
        extra = s.storage.extra_config_arg()
        if extra is not None:
            out.append((STORAGE_FLAGS["extra_config"], extra))
        if s.storage.prefetch_policy is not None:
            out.append((STORAGE_FLAGS["prefetch_policy"], s.storage.prefetch_policy))
    return out


def hicache_flags(profile: Profile, role: str) -> list[FlagValue]:
    """The HiCache flags of a server of `role` (none when the role runs no HiCache)."""
    hc = profile.sglang.hicache
    s = hc.settings_for(role) if hc is not None else None
    if hc is None or s is None:
        return []
    mode = hc.decode_mode() if role == "decode" else None
    if role == "decode" and mode is None:
        return []  # refused when the profile loads (decode.mode missing); nothing sensible to render
    if mode == "offload":
        return [(DECODE_OFFLOAD_FLAG, None), *_settings_flags(s)]
    out: list[FlagValue] = [(ENABLE_FLAG, None)]
    if mode == "radix":
        out.append((DECODE_RADIX_FLAG, None))
    out.extend(_settings_flags(s))
    if hc.eviction_policy is not None:
        out.append((EVICTION_FLAG, hc.eviction_policy))
    if hc.eviction_policy_config is not None:
        out.append((SECTION_FLAGS["eviction_policy_config"],
                    json.dumps(hc.eviction_policy_config, sort_keys=True, separators=(",", ":"))))
    if hc.session_cache:
        out.append((SECTION_FLAGS["session_cache"], None))
    return out


def hicache_field_of(profile: Profile, role: str, flag: str) -> str | None:
    """The profile field that renders `flag` on a server of `role` (the role's own block when it sets the
    field), for findings that name the field to change; None when the section does not render it."""
    hc = profile.sglang.hicache
    if hc is None or hc.settings_for(role) is None:
        return None
    own = getattr(hc, role)
    own_set = set(own.model_fields_set) if own is not None else set()
    for field, f in SETTING_FLAGS.items():
        if f == flag:
            return f"sglang.hicache.{role}.{field}" if field in own_set else f"sglang.hicache.{field}"
    for field, f in STORAGE_FLAGS.items():
        if f == flag:
            return f"sglang.hicache.{role}.storage.{field}" if "storage" in own_set else f"sglang.hicache.storage.{field}"
    for field, f in SECTION_FLAGS.items():
        if f == flag:
            return f"sglang.hicache.{field}"
    if flag in (ENABLE_FLAG, DECODE_RADIX_FLAG, DECODE_OFFLOAD_FLAG):
        return "sglang.hicache.decode.mode" if role == "decode" else "sglang.hicache.roles"
    return None
