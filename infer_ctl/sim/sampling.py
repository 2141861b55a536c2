"""SGLang 0.5.23's sampling-parameter checks (`sampling/sampling_params.py`: `__post_init__` defaults,
`normalize`'s greedy rewrite, then `verify`), so a request the engine refuses is refused here with the
same text. The simulator samples nothing with these values; only their validity matters.

The value is printed as the engine holds it: on `/generate` the JSON value as decoded (`-1` stays an
int: "got -1."), on the OpenAI routes the request model's float ("got -1.0."). Checks that need the
model (`logit_bias` against the vocabulary, reasoning token ids in `custom_params`) are not made. Pure.
"""

from __future__ import annotations

import math
from typing import Any

_EPS = 1e-6  # _SAMPLING_EPS: below it a temperature means greedy (top_k 1)
#: OpenAI request fields that reach SamplingParams, with their pydantic type (what the value prints as)
OPENAI_FIELDS: dict[str, tuple[str, type]] = {
    "temperature": ("temperature", float), "top_p": ("top_p", float), "top_k": ("top_k", int),
    "min_p": ("min_p", float), "frequency_penalty": ("frequency_penalty", float),
    "presence_penalty": ("presence_penalty", float), "repetition_penalty": ("repetition_penalty", float),
    "min_tokens": ("min_new_tokens", int),
}


def _get(params: dict[str, Any], key: str, default: Any) -> Any:
    value = params.get(key)
    return default if value is None else value


def verify(params: dict[str, Any]) -> str | None:
    """The first ValueError text `SamplingParams.verify` raises for these params, or None."""
    temperature = _get(params, "temperature", 1.0)
    top_k = _get(params, "top_k", -1)
    if 0 <= temperature < _EPS:
        top_k = 1
    beam = params.get("beam_width")
    checks: list[tuple[bool, str]] = [
        (beam is not None and beam < 1, f"beam_width must be at least 1, got {beam}."),
        (not math.isfinite(temperature) or temperature < 0.0,
         f"temperature must be a non-negative finite number, got {temperature}."),
    ]
    top_p, min_p = _get(params, "top_p", 1.0), _get(params, "min_p", 0.0)
    freq, pres = _get(params, "frequency_penalty", 0.0), _get(params, "presence_penalty", 0.0)
    rep, min_new = _get(params, "repetition_penalty", 1.0), _get(params, "min_new_tokens", 0)
    checks += [
        (not 0.0 < top_p <= 1.0, f"top_p must be in (0, 1], got {top_p}."),
        (not 0.0 <= min_p <= 1.0, f"min_p must be in [0, 1], got {min_p}."),
        # -1 was rewritten to the whole vocabulary before this check, so only other values below 1 fail
        (top_k != -1 and top_k < 1, f"top_k must be -1 (disable) or at least 1, got {top_k}."),
        (not -2.0 <= freq <= 2.0, f"frequency_penalty must be in [-2, 2], got {freq}."),
        (not -2.0 <= pres <= 2.0, f"presence_penalty must be in [-2, 2], got {pres}."),
        (not 0.0 < rep <= 2.0, f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rep}."),
        (min_new < 0, f"min_new_tokens must be in [0, max_new_tokens], got {min_new}."),
    ]
    max_new = params.get("max_new_tokens")
    if isinstance(max_new, int) and max_new >= 0 and not min_new <= max_new:
        checks.append((True, f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}."))
    grammars = sum(params.get(k) not in (None, "") for k in ("json_schema", "regex", "ebnf", "structural_tag"))
    checks.append((grammars > 1, "Only one of json_schema, regex, ebnf, or structural_tag can be set."))
    return next((text for failed, text in checks if failed), None)


def from_openai(body: dict[str, Any]) -> dict[str, Any]:
    """The SamplingParams an OpenAI body gives (only the fields `verify` reads), typed as its model types them."""
    out: dict[str, Any] = {}
    for field, (name, kind) in OPENAI_FIELDS.items():
        value = body.get(field)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = kind(value)
    return out
