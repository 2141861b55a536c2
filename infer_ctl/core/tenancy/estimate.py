"""What a request may cost a tenant's tokens-per-minute bucket, known before it runs: the reservation
taken at admission (router/observe/tenants.py), settled with the workers' reported usage when it ends.

prompt: its characters over the router's chars-per-token estimate (token ids counted as they are);
completion: the request's own limit, else SGLang 0.5.23's default for the endpoint (python/sglang/srt/
sampling/sampling_params.py `max_new_tokens = 128` for /generate; entrypoints/openai/protocol.py
CompletionRequest `max_tokens = 16`); a chat request without max_tokens / max_completion_tokens has no
limit there (SGLang generates up to the context) and reserves its prompt only. Times the samples (`n`)
and the prompts of a batch. Pure: no I/O.
"""

from __future__ import annotations

import math
from typing import Any

from infer_ctl.core.routing.units import CHARS_PER_TOKEN

#: SGLang 0.5.23 defaults when the request names no limit (module docstring)
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _one_prompt(p: Any, cpt: float) -> float | None:
    if isinstance(p, str):
        return len(p) / cpt
    if isinstance(p, list) and p and all(isinstance(t, int) for t in p):
        return float(len(p))
    return None


def _prompt_tokens(prompt: Any, cpt: float) -> list[float]:
    """Per prompt of a (possibly batched) text / ids field: its estimated tokens. SGLang's shapes only (a
    string or ids, or a list of them): deeper nesting is not a prompt there, and walking it recursively
    let a 1000-deep JSON list raise RecursionError after the tenant's admission (its slot leaked)."""
    one = _one_prompt(prompt, cpt)
    if one is not None:
        return [one]
    if not isinstance(prompt, list):
        return []
    return [n for n in (_one_prompt(p, cpt) for p in prompt) if n is not None]


def _chat_chars(messages: Any) -> int:
    total = 0
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):  # OpenAI content parts: the text ones
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


def request_tokens(endpoint: str, body: Any, chars_per_token: float) -> int:
    """Estimated prompt + completion tokens of a request body (0 for one that is not a JSON object)."""
    return sum(request_estimate(endpoint, body, chars_per_token))


def request_estimate(endpoint: str, body: Any, chars_per_token: float) -> tuple[int, int]:
    """(prompt, completion) estimated tokens of a request body ((0, 0) for one that is not a JSON object).
    The prompt part alone is what a cancelled stream is settled against (router/request/observe.py)."""
    if not isinstance(body, dict):
        return 0, 0
    cpt = chars_per_token if chars_per_token > 0 else CHARS_PER_TOKEN
    n = _count(body.get("n")) or 1
    if endpoint.endswith("/chat/completions"):
        prompts = [_chat_chars(body.get("messages")) / cpt]
        limit = _count(body.get("max_completion_tokens"))
        limit = limit if limit is not None else _count(body.get("max_tokens")) or 0
    elif endpoint.endswith("/completions"):
        prompts = _prompt_tokens(body.get("prompt"), cpt) or [0.0]
        limit = _count(body.get("max_tokens"))
        limit = COMPLETIONS_DEFAULT_MAX_TOKENS if limit is None else limit
    else:  # /generate: text or input_ids; sampling_params one dict or one per prompt
        prompts = _prompt_tokens(body.get("text") if body.get("text") is not None else body.get("input_ids"), cpt)
        prompts = prompts or [0.0]
        params = body.get("sampling_params")
        plist = params if isinstance(params, list) else [params]
        limits = [_count(p.get("max_new_tokens")) if isinstance(p, dict) else None for p in plist]
        limit = max((GENERATE_DEFAULT_MAX_NEW_TOKENS if v is None else v for v in limits),
                    default=GENERATE_DEFAULT_MAX_NEW_TOKENS)
        n = max([_count(p.get("n")) or 1 for p in plist if isinstance(p, dict)] or [n])
    return math.ceil(sum(prompts)), len(prompts) * n * limit
