"""The SGLang PD request protocol, as pure transformations of JSON bodies (docs/router.md, "The PD protocol").

The router picks a prefill and a decode worker, adds bootstrap_host / bootstrap_port / bootstrap_room
to the body and sends the same body to both. Rooms are random and never 0 (a decode treats a metadata
room of 0 as "not landed yet" and would stall), drawn below 2**63 - 1024 so that SGLang's expansion of
a scalar room to room+i for a batch of i items cannot overflow. /generate batches get per-item lists
with a fresh room each, like SGLang's own routers; OpenAI endpoints get scalars.
"""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import urlsplit

ROOM_MIN = 1
ROOM_MAX = 2**63 - 1024
#: SGLang's fake bootstrap host: a prefill skips the KV transfer for it (health checks, warm-ups)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


def new_room(rng: random.Random) -> int:
    return rng.randrange(ROOM_MIN, ROOM_MAX)


def bootstrap_host(prefill_url: str) -> str:
    host = urlsplit(prefill_url).hostname or ""
    return f"[{host}]" if ":" in host else host


def batch_size(endpoint: str, body: dict[str, Any]) -> int | None:
    """Items in a /generate batch, or None for a single request (which takes scalars)."""
    if endpoint != "/generate":
        return None
    text = body.get("text")
    if isinstance(text, list):
        return len(text)
    ids = body.get("input_ids")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        return len(ids)
    return None


def with_bootstrap(
    body: dict[str, Any], endpoint: str, host: str, port: int | None, rng: random.Random
) -> dict[str, Any]:
    """A copy of `body` with the PD fields set (any client-sent ones are replaced)."""
    out = dict(body)
    n = batch_size(endpoint, body)
    if n is None:
        out["bootstrap_host"] = host
        out["bootstrap_port"] = port
        out["bootstrap_room"] = new_room(rng)
    else:
        out["bootstrap_host"] = [host] * n
        out["bootstrap_port"] = [port] * n
        out["bootstrap_room"] = [new_room(rng) for _ in range(n)]
    return out


# ---- input logprob merge -------------------------------------------------------------------------
_MERGED_KEYS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs")


def _merge_meta(prefill_meta: dict[str, Any], decode_meta: dict[str, Any]) -> None:
    for key in _MERGED_KEYS:
        pre = prefill_meta.get(key)
        if isinstance(pre, list):
            dec = decode_meta.get(key)
            decode_meta[key] = pre + (dec if isinstance(dec, list) else [])


def merge_input_logprobs(prefill: Any, decode: Any) -> Any:
    """Prefill computed the prompt's logprobs; the decode's response lacks them. Prepend them to the
    decode's meta_info (elementwise for batches). Returns `decode`, modified in place."""
    if isinstance(prefill, list) and isinstance(decode, list):
        for p, d in zip(prefill, decode, strict=False):
            merge_input_logprobs(p, d)
        return decode
    if isinstance(prefill, dict) and isinstance(decode, dict):
        pm, dm = prefill.get("meta_info"), decode.get("meta_info")
        if isinstance(pm, dict) and isinstance(dm, dict):
            _merge_meta(pm, dm)
    return decode


def wants_logprobs(body: dict[str, Any]) -> bool:
    return bool(body.get("return_logprob"))


def parallel_samples(body: dict[str, Any]) -> int:
    """The request's `n` (OpenAI) or `sampling_params.n` (native; the largest of a batch's): how many
    samples SGLang draws per prompt. 1 when absent or not a number."""
    n = body.get("n")
    params = body.get("sampling_params")
    ns = [n] + ([p.get("n") for p in params if isinstance(p, dict)] if isinstance(params, list)
                else [params.get("n")] if isinstance(params, dict) else [])
    return max([v for v in ns if isinstance(v, int) and not isinstance(v, bool)] or [1])
