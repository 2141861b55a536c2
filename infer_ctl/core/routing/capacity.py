"""How much KV a request may need on its decode: its prompt plus every token it may generate (docs/router.md,
"Decode chosen by capacity"). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: SGLang's max_new_tokens when a /generate request gives none (sampling_params.py); the OpenAI routes
#: without max_tokens may generate up to the context: the same default keeps the estimate finite
DEFAULT_MAX_TOKENS = 128


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def max_tokens(endpoint: str, body: Mapping[str, Any]) -> int:
    """The output tokens the request allows, per sequence."""
    if endpoint == "/generate":
        sp = body.get("sampling_params")
        v = _count(sp.get("max_new_tokens")) if isinstance(sp, Mapping) else None
    else:
        v = _count(body.get("max_completion_tokens"))
        v = v if v is not None else _count(body.get("max_tokens"))
    return DEFAULT_MAX_TOKENS if v is None else v


def kv_need(endpoint: str, body: Mapping[str, Any], prompt_chars: int, chars_per_token: float) -> int:
    """Prompt tokens (estimated from its characters) plus max tokens for each of `n` sequences (SGLang
    shares the prompt's KV between them)."""
    n = _count(body.get("n")) or 1
    if endpoint == "/generate":
        sp = body.get("sampling_params")
        n = (_count(sp.get("n")) if isinstance(sp, Mapping) else None) or 1
    return int(prompt_chars / max(chars_per_token, 0.5)) + n * max_tokens(endpoint, body)
