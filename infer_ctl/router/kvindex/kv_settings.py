"""The tokenizer the router's KV events are read with (`router.kv_events.tokenizer_path`, `router serve
--kv-tokenizer`; the other KV-events settings are the profile's router.kv_events, profile/router_kv.py).

A tokenizer the operator names (key or flag) must be there at start: a wrong path would otherwise only
show as a start-up log line and a fleet silently routed on the predicted index. The default (the
profile's model path) stays soft: it may name the path on the GPU nodes only.
"""

from __future__ import annotations

import os
from pathlib import Path

from infer_ctl.errors import UsageError


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
