"""The router's KV-events settings from a profile (`router.kv_events`) and from `router serve` flags.

Both land on RouterConfig's kv_* fields (router/config.py), which router/request/proxy.py turns into KvRouting
and StreamSettings. A tokenizer the operator names (key or flag) must be there at start: a wrong path
would otherwise only show as a start-up log line and a fleet silently routed on the predicted index.
The default (the profile's model path) stays soft: it may name the path on the GPU nodes only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from infer_ctl.errors import UsageError

if TYPE_CHECKING:
    from infer_ctl.profile import Profile


class KvConfig(Protocol):
    """RouterConfig's KV-events fields (router/config.py imports this module, not the reverse)."""

    kv_events: bool
    tokenizer_path: str | None
    kv_max_blocks: int
    kv_max_blocks_per_medium: int | None
    kv_replay_timeout_s: float
    kv_max_batches_per_s: int
    kv_max_message_bytes: int
    kv_anchor_max_chars: int


def tokenizer_file(path: str) -> str:
    """The tokenizer.json a tokenizer path names (router/kvindex/kv_prompts.py reads the same file)."""
    return path if path.endswith(".json") else os.path.join(path, "tokenizer.json")


def checked_tokenizer(path: str, where: str, base: Path | None = None) -> str:
    """`path` (~ expanded, relative to `base`) if it holds a tokenizer.json; else a UsageError naming
    `where` (the flag or profile key)."""
    p = Path(os.path.expanduser(path))
    if base is not None and not p.is_absolute():
        p = base / p
    file = tokenizer_file(str(p))
    if not os.path.isfile(file):
        raise UsageError(f"{where} {path!r}: no {file}",
                         remedy="give the target model's directory (with tokenizer.json and tokenizer_config.json) "
                                "as it is on the router's host")
    return str(p)


def apply_profile(cfg: KvConfig, profile: Profile) -> None:
    kv = profile.router.kv_events
    cfg.kv_events = kv.enabled
    cfg.kv_max_blocks = kv.max_blocks
    cfg.kv_max_blocks_per_medium = kv.max_blocks_per_medium
    cfg.kv_replay_timeout_s = kv.replay_timeout_s
    cfg.kv_max_batches_per_s = kv.max_batches_per_s
    cfg.kv_max_message_bytes = kv.max_message_bytes
    cfg.kv_anchor_max_chars = kv.anchor_max_chars
    if kv.tokenizer_path is not None and kv.enabled:
        cfg.tokenizer_path = checked_tokenizer(kv.tokenizer_path, "router.kv_events.tokenizer_path",
                                               profile.base_dir)


def apply_flags(cfg: KvConfig, *, enabled: bool | None = None, tokenizer: str | None = None,
                replay_timeout_s: float | None = None, max_blocks: int | None = None,
                max_batches_per_s: int | None = None) -> None:
    """`router serve` flags over the profile's (or the defaults'): None leaves a setting as it is."""
    if enabled is not None:
        cfg.kv_events = enabled
    if tokenizer is not None:
        cfg.tokenizer_path = checked_tokenizer(tokenizer, "--kv-tokenizer")
    if replay_timeout_s is not None:
        cfg.kv_replay_timeout_s = replay_timeout_s
    if max_blocks is not None:
        cfg.kv_max_blocks = max_blocks
    if max_batches_per_s is not None:
        cfg.kv_max_batches_per_s = max_batches_per_s
