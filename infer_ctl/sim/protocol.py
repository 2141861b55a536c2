"""Parsing SGLang/OpenAI request bodies and shaping responses. Pure: no aiohttp, no asyncio.

Validation errors raise `RequestError(status, message)`; the HTTP layer renders them the way SGLang
does: native endpoints `{"error": {"message"}}` for 400 and `{"detail": ...}` otherwise, OpenAI
endpoints `{"object": "error", "message", "type", "param", "code"}`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from infer_ctl.sim import contract
from infer_ctl.sim.tokenizer import Tokenizer, render_chat

# Room 0 is never valid: SGLang's decode reads a metadata room of 0 as "not yet landed".
ROOM_MAX = 2**63 - 1


class RequestError(Exception):
    """A request SGLang would refuse. `kind` says which of its layers refuses it, which fixes the body:
    "body" (pydantic parse: 400 ErrorResponse type "Bad Request"), "contract" (schema gate: 400
    `{"error": text}`), "value" (a ValueError in generate_request: 400 `{"error": {"message"}}`, or an SSE
    error chunk on a stream), "abort" (a scheduler abort: the finish_reason's status; non-400 codes go
    through FastAPI's HTTPException handler as ErrorResponse type "<code>")."""

    def __init__(self, status: int, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind or ("value" if status == 400 else "abort")


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
    #: index of this sample among n parallel samples of one prompt (sampling_params.n)
    sample: int = 0
    return_logprob: bool = False
    #: SGLang's logprob_start_len as sent (-1 = output logprobs only)
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    #: temperature 0: each output token is a function of the whole context (engine.greedy_token), as a
    #: model's greedy choice is, so a continuation from prompt + emitted tokens goes on exactly
    greedy: bool = False


@dataclass
class GenRequest:
    items: list[GenItem]
    batched: bool
    stream: bool
    #: samples per prompt (sampling_params.n / OpenAI n); items hold prompts x parallel samples
    parallel: int = 1
    #: OpenAI-only bits
    model: str | None = None
    include_usage: bool = False
    #: SGLang's per-request metric labels (`custom_labels`); the simulator reads the workload domain there
    custom_labels: dict[str, str] | None = None


def _labels(value: Any) -> dict[str, str] | None:
    """`custom_labels` when it is a string map (SGLang's Dict[str, str]); anything else is not a label set."""
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return dict(value)
    return None


def _int_field(value: Any, name: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"{name} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise RequestError(400, f"{name} must be at least {minimum}, got {value}")
    return value


def _pd_list(value: Any, prompts: int, name: str, copies: int = 1) -> list[Any]:
    """One value per sample, in SGLang's order `[p0, p1, .., p0, p1, ..]` (`prompts` x `copies`).

    `_normalize_bootstrap_params` repeats a list per parallel sample (list * n) and expands a scalar room
    to room+j; then, for n > 1, `tokenizer_manager._handle_batch_request` copies `obj[i]` (i < prompts)
    for every sample of prompt i, so all samples of a prompt carry prompt i's host, port and room."""
    if isinstance(value, list):
        expanded = value * copies
        if len(expanded) < prompts:
            raise RequestError(400, f"{name} has {len(value)} entries for a batch of {prompts}")
        base = expanded[:prompts]
    elif name == "bootstrap_room" and value is not None:
        base = [_int_field(value, name) + i for i in range(prompts)]
    else:
        base = [value] * prompts
    return [base[k % prompts] for k in range(prompts * copies)]


def _pd_fields(body: dict[str, Any], prompts: int, copies: int = 1) -> list[PdFields]:
    hosts = _pd_list(body.get("bootstrap_host"), prompts, "bootstrap_host", copies)
    ports = _pd_list(body.get("bootstrap_port"), prompts, "bootstrap_port", copies)
    rooms = _pd_list(body.get("bootstrap_room"), prompts, "bootstrap_room", copies)
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
    mnt = default if mnt is None else _int_field(mnt, "max_new_tokens")
    if mnt < 0:  # SamplingParams.verify
        raise RequestError(400, f"max_new_tokens must be at least 0, got {mnt}.")
    seed = params.get("sampling_seed")
    return mnt, None if seed is None else _int_field(seed, "sampling_seed")


def _per_item(value: Any, n: int, default: Any) -> list[Any]:
    if value is None:
        return [default] * n
    return list(value) if isinstance(value, list) else [value] * n


def _parallel(params: Any) -> int:
    first = params[0] if isinstance(params, list) and params else params
    n = first.get("n", 1) if isinstance(first, dict) else 1
    n = 1 if n is None else _int_field(n, "n")
    if n < 1:
        raise RequestError(400, f"n must be at least 1, got {n}.")
    return n


def parse_generate(body: Any, tok: Tokenizer) -> GenRequest:
    """Parse a native /generate body through SGLang's three gates (contract.py, then semantics)."""
    if (err := contract.body_error(body)) is not None:
        raise RequestError(400, err, "body")
    if (err := contract.contract_error(body)) is not None:
        raise RequestError(400, err, "contract")
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
        prompts = [tok.encode(t) for t in (text if batched else [text])]
    else:
        batched = bool(ids) and isinstance(ids[0], list)
        prompts = [list(x) for x in (ids if batched else [ids])]
    if not prompts or any(not p for p in prompts):
        raise RequestError(400, "The input must not be empty (0 tokens).")
    params = body.get("sampling_params")
    copies = _parallel(params)
    if copies > 1:  # SGLang's parallel sampling: a single prompt becomes a batch, inputs repeat n times
        batched = True
    n = len(prompts)
    param_list = params if isinstance(params, list) else [params] * n
    if len(param_list) != n:
        raise RequestError(400, f"sampling_params has {len(param_list)} entries for a batch of {n}")
    rid = body.get("rid")
    if isinstance(rid, list) and len(rid) != n:
        raise RequestError(400, "The specified rids length mismatch with the batch_size for batch processing.")
    rids = rid if isinstance(rid, list) else [f"{rid}_{i}" if rid and batched else rid for i in range(n)]
    priority = _int_field(body.get("priority") or 0, "priority")
    total = n * copies
    pds = _pd_fields(body, n, copies)
    want = _per_item(body.get("return_logprob"), n, False)
    starts = _per_item(body.get("logprob_start_len"), n, -1)
    tops = _per_item(body.get("top_logprobs_num"), n, 0)
    if copies > 1 and any(isinstance(body.get(k), list) for k in ("return_logprob", "logprob_start_len",
                                                                     "top_logprobs_num")):
        raise RequestError(400, "Cannot use list return_logprob with parallel_sample_num > 1")
    items = []
    for k in range(total):
        i = k % n  # SGLang's order: [p0, p1, ..., p0, p1, ...]
        mnt, seed = _max_new_tokens(param_list[i])
        items.append(
            GenItem(
                rid=(f"{rids[i]}_{k // n}" if copies > 1 and rids[i] else str(rids[i]))
                if rids[i] else uuid.uuid4().hex,
                input_ids=prompts[i],
                max_new_tokens=mnt,
                pd=pds[k],
                priority=priority,
                sampling_seed=seed,
                sample=k // n,
                return_logprob=bool(want[i]),
                logprob_start_len=int(starts[i]) if want[i] else -1,
                top_logprobs_num=int(tops[i] or 0) if want[i] else 0,
                return_text_in_logprobs=bool(body.get("return_text_in_logprobs")),
                greedy=(param_list[i] or {}).get("temperature") == 0,  # SGLang's default is 1.0
            )
        )
    return GenRequest(items=items, batched=batched, stream=bool(body.get("stream")), parallel=copies,
                      custom_labels=_labels(body.get("custom_labels")))


def _openai_int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():  # pydantic's lax mode parses these
        v = int(v)
    if not isinstance(v, int):
        raise RequestError(400, contract.pydantic_int_error(key, v), "body")
    return int(v)


def parse_openai(body: Any, tok: Tokenizer, chat: bool) -> GenRequest:
    """Parse /v1/completions or /v1/chat/completions: pydantic-shape errors are "body" errors (400
    ErrorResponse type "Bad Request"), the serving layer's own checks are "value" errors."""
    if not isinstance(body, dict):
        raise RequestError(400, contract.model_type_error("ChatCompletionRequest" if chat else
                                                          "CompletionRequest", body), "body")
    prompt: Any
    if chat:
        messages = body.get("messages")
        if messages is None:
            raise RequestError(400, contract.missing_error("messages"), "body")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise RequestError(400, contract.list_error("messages", messages), "body")
        if not messages:
            raise RequestError(400, "Messages cannot be empty.")
        prompt = render_chat(messages)
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise RequestError(400, contract.missing_error("prompt"), "body")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise RequestError(400, "the simulator takes one string prompt on /v1/completions")
        if not prompt:
            raise RequestError(400, "Prompt cannot be empty")
    mnt = _openai_int(body, "max_completion_tokens") if chat else None
    if mnt is None:
        mnt = _openai_int(body, "max_tokens")
    if mnt is not None and mnt < 0:
        raise RequestError(400, f"max_new_tokens must be at least 0, got {mnt}.")
    copies = _openai_int(body, "n") or 1
    if copies < 1:
        raise RequestError(400, f"n must be at least 1, got {copies}.")
    seed = _openai_int(body, "seed")
    priority = _openai_int(body, "priority") or 0
    opts = body.get("stream_options") or {}
    ids = tok.encode(prompt)
    rid = body.get("rid")
    # sgl-router sends per-sample bootstrap lists when n > 1; SGLang still gives every sample entry 0
    pds = _pd_fields(body, 1, copies)
    items = [
        GenItem(
            rid=(f"{rid}_{k}" if copies > 1 else str(rid)) if rid else uuid.uuid4().hex,
            input_ids=ids,
            max_new_tokens=128 if mnt is None else mnt,
            pd=pds[k],
            priority=priority,
            sampling_seed=seed,
            sample=k,
        )
        for k in range(copies)
    ]
    return GenRequest(
        items=items,
        batched=copies > 1,
        stream=bool(body.get("stream")),
        parallel=copies,
        model=body.get("model"),
        include_usage=bool(isinstance(opts, dict) and opts.get("include_usage")),
        custom_labels=_labels(body.get("custom_labels")),
    )


# -- responses ----------------------------------------------------------------------------------------
def finish_reason(completion: int, aborted: str | None = None, status: int = 500) -> dict[str, Any]:
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
    cached_details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "reasoning_tokens": 0,
        "cached_tokens": cached_tokens,
        # SGLang's breakdown (scheduler_components/output_streamer.py get_cached_tokens_details): where the
        # cached tokens came from; HiCache workers pass theirs (sim/tiers.py cached_details); null when
        # nothing was cached (the function returns None, and the tokenizer manager copies it)
        "cached_tokens_details": cached_details or ({"device": cached_tokens, "host": 0} if cached_tokens else None),
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


def error_response(status: int, message: str, err_type: str) -> dict[str, Any]:
    """SGLang's ErrorResponse model (`openai/protocol.py`)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def openai_error(exc: RequestError) -> dict[str, Any]:
    """What SGLang's OpenAI endpoints answer: pydantic failures "Bad Request", the serving layer's
    ValueErrors "BadRequestError", HTTPExceptions (non-400 aborts) their status code as the type."""
    if exc.kind == "body":
        return error_response(400, exc.message, "Bad Request")
    return error_response(exc.status, exc.message, "BadRequestError" if exc.status == 400 else str(exc.status))


def native_error(exc: RequestError) -> tuple[int, dict[str, Any]]:
    """What SGLang's /generate answers for a refused (non-streamed) request: see RequestError."""
    if exc.kind == "body":
        return 400, error_response(400, exc.message, "Bad Request")
    if exc.kind == "contract":
        return 400, {"error": exc.message}
    if exc.status == 400:
        return 400, {"error": {"message": exc.message}}
    return exc.status, error_response(exc.status, exc.message, str(exc.status))


def stream_value_error(exc: RequestError) -> dict[str, Any]:
    """A ValueError raised inside a /generate stream: SGLang sends it as one SSE chunk on a 200 stream."""
    return {"error": {"message": exc.message, "type": "invalid_request_error", "code": exc.status,
                      "retryable": False}}


def now_s() -> int:
    return int(time.time())
