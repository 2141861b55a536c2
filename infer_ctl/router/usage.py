"""Reading prompt and cached token counts out of worker responses (SGLang meta_info or OpenAI usage)."""

from __future__ import annotations

from typing import Any


def token_counts(obj: Any) -> tuple[int | None, int | None]:
    """(prompt_tokens, cached_tokens) of a /generate or OpenAI response or stream chunk."""
    if isinstance(obj, list):
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        return None, None
    meta = obj.get("meta_info")
    if isinstance(meta, dict):
        return _int(meta.get("prompt_tokens")), _int(meta.get("cached_tokens"))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return _int(usage.get("prompt_tokens")), _int(cached)
    return None, None


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None
