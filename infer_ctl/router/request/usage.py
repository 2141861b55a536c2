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


def usage_totals(obj: Any) -> tuple[int, int, int]:
    """(prompt, cached, completion) tokens of a whole answer, summed over a /generate batch's items (the
    tenants' accounting: every item was computed)."""
    items = obj if isinstance(obj, list) else [obj]
    prompt = cached = completion = 0
    for item in items:
        if not isinstance(item, dict):
            continue
        meta = item.get("meta_info")
        if isinstance(meta, dict):
            prompt += _int(meta.get("prompt_tokens")) or 0
            cached += _int(meta.get("cached_tokens")) or 0
            completion += _int(meta.get("completion_tokens")) or 0
            continue
        usage = item.get("usage")
        if isinstance(usage, dict):
            details = usage.get("prompt_tokens_details")
            prompt += _int(usage.get("prompt_tokens")) or 0
            cached += (_int(details.get("cached_tokens")) if isinstance(details, dict) else None) or 0
            completion += _int(usage.get("completion_tokens")) or 0
    return prompt, cached, completion
