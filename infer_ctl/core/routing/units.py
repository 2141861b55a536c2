"""The routing units and their one conversion: characters, tokens and index blocks.

The predicted index (core/routing/index.py) counts characters in blocks of `block_chars`; the workers, their
KV events and their answers count tokens. The router converts with the characters-per-token ratio it learns
from the answers (router/request/feedback.py); until it has learned one, CHARS_PER_TOKEN. Every conversion
goes through here so each number's unit is named where it is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: characters per token before the router has learned the ratio from an answer (English text with
#: a BPE tokenizer is about 4)
CHARS_PER_TOKEN = 4.0


def ratio(learned: float | None) -> float:
    """The characters-per-token ratio to convert with: the learned one, else CHARS_PER_TOKEN (a ratio not
    learned yet reads 0 or None)."""
    return learned or CHARS_PER_TOKEN


def chars_to_tokens(chars: float, chars_per_token: float) -> int:
    return int(chars / chars_per_token)


def blocks_to_tokens(blocks: int, block_chars: int, chars_per_token: float) -> int:
    return int(blocks * block_chars / chars_per_token)


@dataclass(frozen=True)
class ScoreInputs:
    """The cache-aware score's inputs on the KV-events path (core/routing/policies/cache_aware.py), each
    count in the unit its name says. Tokens are the workers' prompt units (tier-weighted where the worker's
    events are trusted: core/routing/tiers.py)."""

    #: prompt tokens each candidate holds: from its events where trusted (raised by the in-flight overlay),
    #: else the predicted index's match converted
    cached_tokens: Mapping[str, int]
    #: the prompt's length
    prompt_tokens: int
    #: what waiting behind one request already on a worker costs, in prefill tokens; None: the prompt's length
    queue_cost_tokens: float | None
    #: cached size per candidate, in characters: only the fallback's tie-break compares them; None: the
    #: predicted index's
    footprint_chars: Mapping[str, int] | None = None


def score_inputs(*, event_tokens: Mapping[str, int], pending_blocks: Mapping[str, int],
                 predicted_chars: Mapping[str, int], reported_prompt_tokens: int | None, text_chars: int,
                 block_chars: int, chars_per_token: float, queue_cost_tokens: float | None,
                 footprint_chars: Mapping[str, int] | None) -> ScoreInputs:
    """The one converter from what the router reads to ScoreInputs. `event_tokens`: tokens held per worker
    whose KV events are trusted; `pending_blocks`: index blocks of the prompt in flight to such a worker
    (core/routing/coalesce.py: counted as held); `predicted_chars`: the predicted index's match on the other
    workers; `reported_prompt_tokens`: the prompt's length from the workers' tokenizer, when known (else
    the prompt's characters converted)."""
    cached = dict(event_tokens)
    for url, blocks in pending_blocks.items():
        if blocks:
            cached[url] = max(cached.get(url, 0), blocks_to_tokens(blocks, block_chars, chars_per_token))
    for url, chars in predicted_chars.items():
        cached[url] = chars_to_tokens(chars, chars_per_token)
    prompt = reported_prompt_tokens or max(1, chars_to_tokens(text_chars, chars_per_token))
    return ScoreInputs(cached, prompt, queue_cost_tokens, footprint_chars)
