"""Pseudo-logprobs in SGLang's `meta_info` format, a pure function of the token sequence.

The logprob of token t at position p is a hash of (previous token, p, t): the same sequence gives the same
numbers on every worker and in every process, whatever the worker's seed, so a PD router's merge of the
prefill's `input_token_logprobs` with the decode's `output_token_logprobs` can be checked against a mixed
worker's single answer. The numbers are in [-12, 0) and are not a normalised distribution; position 0 has
no logprob (None), as in SGLang. Entries are `[logprob, token_id, text-or-None]` (text only with
`return_text_in_logprobs`); top lists hold the `top_logprobs_num` highest over the output vocabulary plus
the actual token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from infer_ctl.sim.tokenizer import WORDS

Entry = list[Any]  # [logprob | None, token_id, text | None]


def token_logprob(prev: int, pos: int, token: int) -> float:
    h = hashlib.blake2b(f"{prev}:{pos}:{token}".encode(), digest_size=8).digest()
    return -12.0 * (int.from_bytes(h, "big") + 1) / 2**64


def _entry(lp: float | None, tid: int, text_fn: Callable[[int], str] | None) -> Entry:
    return [lp, tid, text_fn(tid) if text_fn else None]


def _top(seq: Sequence[int], p: int, k: int, text_fn: Callable[[int], str] | None) -> list[Entry] | None:
    if p == 0:
        return None
    cands = {*range(len(WORDS)), seq[p]}
    scored = sorted(((token_logprob(seq[p - 1], p, t), t) for t in cands), key=lambda x: (-x[0], x[1]))
    return [_entry(lp, t, text_fn) for lp, t in scored[:k]]


def logprob_fields(
    seq: Sequence[int],
    start: int,
    end: int,
    side: str,
    top_n: int,
    text_fn: Callable[[int], str] | None,
) -> dict[str, Any]:
    """`{side}_token_logprobs` (and `{side}_top_logprobs` when top_n > 0) for positions [start, end)."""
    entries = [
        _entry(None if p == 0 else token_logprob(seq[p - 1], p, seq[p]), seq[p], text_fn)
        for p in range(start, end)
    ]
    out: dict[str, Any] = {f"{side}_token_logprobs": entries}
    if top_n > 0:
        out[f"{side}_top_logprobs"] = [_top(seq, p, top_n, text_fn) for p in range(start, end)]
    return out


def meta_logprobs(
    input_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    start: int,
    top_n: int,
    text_fn: Callable[[int], str] | None,
    with_input: bool = True,
    with_output: bool = True,
) -> dict[str, Any]:
    """SGLang's logprob keys for one request. `start` is the resolved logprob_start_len (len(input) = no
    input logprobs). A PD prefill answers with_output=False, a decode with_input=False."""
    seq = [*input_ids, *output_ids]
    n = len(input_ids)
    inp = logprob_fields(seq, start, n, "input", top_n, text_fn) if with_input else {
        "input_token_logprobs": [], **({"input_top_logprobs": []} if top_n > 0 else {})}
    out = logprob_fields(seq, n, len(seq), "output", top_n, text_fn) if with_output else {
        "output_token_logprobs": [], **({"output_top_logprobs": []} if top_n > 0 else {})}
    meta = {**inp, **out}
    meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
    return meta
