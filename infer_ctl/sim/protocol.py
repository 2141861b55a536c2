"""Parsing SGLang/OpenAI request bodies and shaping responses. Pure: no aiohttp, no asyncio.

Validation errors raise `RequestError(status, message)`; the HTTP layer renders them the way SGLang
does: native endpoints `{"error": {"message"}}` for 400 and `{"detail": ...}` otherwise, OpenAI
endpoints `{"object": "error", "message", "type", "param", "code"}`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.sim.tokenizer import Tokenizer, render_chat

# Room 0 is never valid: SGLang's decode reads a metadata room of 0 as "not yet landed".
ROOM_MAX = 2**63 - 1


class RequestError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


@dataclass
class PdFields:
    host: str | None
    port: int | None
    room: int | None


@dataclass
class GenItem:
    """One prompt of a (possibly batched) request."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    pd: PdFields
    priority: int = 0
    sampling_seed: int | None = None


@dataclass
class GenRequest:
    items: list[GenItem]
    batched: bool
    stream: bool
    raw: dict[str, Any] = field(default_factory=dict)
    #: OpenAI-only bits
    model: str | None = None
    include_usage: bool = False
    echo_prompt: str | None = None


def _int_field(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise RequestError(400, f"{name} must be at least {minimum}, got {value}")
    return value


def _pd_list(value: Any, n: int, name: str) -> list[Any]:
    """SGLang's `_normalize_bootstrap_params`: lists per item, scalars broadcast (room -> room+i)."""
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(400, f"{name} has {len(value)} entries for a batch of {n}")
        return value
    if name == "bootstrap_room" and value is not None:
        return [_int_field(value, name) + i for i in range(n)]
    return [value] * n


def _pd_fields(body: dict[str, Any], n: int) -> list[PdFields]:
    hosts = _pd_list(body.get("bootstrap_host"), n, "bootstrap_host")
    ports = _pd_list(body.get("bootstrap_port"), n, "bootstrap_port")
    rooms = _pd_list(body.get("bootstrap_room"), n, "bootstrap_room")
    out = []
    for h, p, r in zip(hosts, ports, rooms, strict=True):
        if p is not None:
            p = _int_field(p, "bootstrap_port", 0)
        if r is not None:
            r = _int_field(r, "bootstrap_room", 0)
            if r > ROOM_MAX:
                raise RequestError(400, f"bootstrap_room must be below 2**63, got {r}")
        out.append(PdFields(h, p, r))
    return out


def _max_new_tokens(params: Any, default: int = 128) -> tuple[int, int | None]:
    if params is None:
        return default, None
    if not isinstance(params, dict):
        raise RequestError(400, "sampling_params must be an object")
    mnt = params.get("max_new_tokens", default)
    mnt = default if mnt is None else _int_field(mnt, "max_new_tokens", 0)
    seed = params.get("sampling_seed")
    return mnt, None if seed is None else _int_field(seed, "sampling_seed")


def parse_generate(body: Any, tok: Tokenizer) -> GenRequest:
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise RequestError(
            400,
            "Either text, input_ids or input_embeds should be provided."
            if text is None
            else "Only one of text, input_ids or input_embeds should be provided.",
        )
    prompts: list[list[int]]
    if text is not None:
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError(400, "text must be a string or a non-empty list of strings")
        prompts = [tok.encode(t) for t in texts]
    else:
        if not isinstance(ids, list):
            raise RequestError(400, "input_ids must be a list of integers or a list of such lists")
        batched = bool(ids) and isinstance(ids[0], list)
        lists: list[Any] = ids if batched else [ids]
        if not all(
            isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)
            for x in lists
        ):
            raise RequestError(400, "input_ids must be a list of integers or a list of such lists")
        prompts = [list(x) for x in lists]
    if any(not p for p in prompts):
        raise RequestError(400, "The input must not be empty (0 tokens).")
    n = len(prompts)
    params = body.get("sampling_params")
    param_list = params if isinstance(params, list) else [params] * n
    if len(param_list) != n:
        raise RequestError(400, f"sampling_params has {len(param_list)} entries for a batch of {n}")
    rid = body.get("rid")
    rids = rid if isinstance(rid, list) else [f"{rid}_{i}" if rid and batched else rid for i in range(n)]
    priority = body.get("priority") or 0
    priority = _int_field(priority, "priority")
    pds = _pd_fields(body, n)
    items = []
    for i, (prompt, p) in enumerate(zip(prompts, param_list, strict=True)):
        mnt, seed = _max_new_tokens(p)
        items.append(
            GenItem(
                rid=str(rids[i]) if rids[i] else uuid.uuid4().hex,
                input_ids=prompt,
                max_new_tokens=mnt,
                pd=pds[i],
                priority=priority,
                sampling_seed=seed,
            )
        )
    return GenRequest(items=items, batched=batched, stream=bool(body.get("stream")), raw=body)


def parse_openai(body: Any, tok: Tokenizer, chat: bool) -> GenRequest:
    if not isinstance(body, dict):
        raise RequestError(400, "The request body must be a JSON object")
    prompt: Any
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise RequestError(400, "messages must be a non-empty list of message objects")
        prompt = render_chat(messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, "prompt must be a non-empty string")
    mnt = body.get("max_completion_tokens") if chat else None
    if mnt is None:
        mnt = body.get("max_tokens")
    max_new = 128 if mnt is None else _int_field(mnt, "max_tokens", 0)
    seed = body.get("seed")
    priority = _int_field(body.get("priority") or 0, "priority")
    opts = body.get("stream_options") or {}
    item = GenItem(
        rid=str(body.get("rid") or uuid.uuid4().hex),
        input_ids=tok.encode(prompt),
        max_new_tokens=max_new,
        pd=_pd_fields(body, 1)[0],
        priority=priority,
        sampling_seed=None if seed is None else _int_field(seed, "seed"),
    )
    return GenRequest(
        items=[item],
        batched=False,
        stream=bool(body.get("stream")),
        raw=body,
        model=body.get("model"),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
    )


# -- responses ----------------------------------------------------------------------------------------
def finish_reason(
    completion: int, max_new: int, aborted: str | None = None, status: int = 500
) -> dict[str, Any]:
    if aborted is not None:
        return {"type": "abort", "message": aborted, "status_code": status, "err_type": None}
    return {"type": "length", "length": completion}


def meta_info(
    rid: str,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    finish: dict[str, Any] | None,
    *,
    e2e_latency: float | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "reasoning_tokens": 0,
        "cached_tokens": cached_tokens,
        "cached_tokens_details": {"device": cached_tokens, "host": 0},
        "weight_version": "default",
        "num_retractions": 0,
    }
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if spec:
        meta.update(spec)
    return meta


def usage(prompt: int, completion: int, cached: int, cache_report: bool) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "reasoning_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": cached} if cache_report else None,
        "completion_tokens_details": None,
    }


def openai_error(status: int, message: str, err_type: str | None = None) -> dict[str, Any]:
    kind = err_type or ("BadRequestError" if status < 500 else "InternalServerError")
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def now_s() -> int:
    return int(time.time())
