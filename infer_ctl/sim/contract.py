"""SGLang 0.5.23's two request gates in front of `/generate`, reproduced so hostile clients see its 400s.

1. FastAPI parses the body into `GenerateReqInput` (pydantic, lax): malformed JSON, a body that is not an
   object, `text`/`input_ids`/`sampling_params` of the wrong container type are a RequestValidationError,
   which `http_server.py` renders as 400 `{"object":"error","message","type":"Bad Request","param":null,
   "code":400}` (`body_error`).
2. `api_contract.generate_contract_error` decodes the same body with the generated schema decoder
   (`sglang/api/v1/api_types.py`): wrong scalar types and unknown `sampling_params` keys are a 400
   `{"error": "<serde text>"}` (`contract_error`). Only the fields the simulator reads or a PD router
   sends are checked; the texts are serde's, verified against the real decoder in tests/sim/test_contract.py.

Semantic errors (text and input_ids both, empty input, context length, negative max_new_tokens) come
later, from `tokenizer_manager.generate_request`, as ValueErrors: see `protocol.py`. Pure module.
"""

from __future__ import annotations

from typing import Any

_SAMPLING_KINDS: dict[str, str] = {
    "max_new_tokens": "i64", "stop": "StringOrList", "stop_token_ids": "seq", "stop_regex": "StringOrList",
    "temperature": "f64", "top_p": "f64", "top_k": "i64", "min_p": "f64", "frequency_penalty": "f64",
    "presence_penalty": "f64", "repetition_penalty": "f64", "min_new_tokens": "i64", "n": "i64",
    "json_schema": "str", "regex": "str", "ebnf": "str", "structural_tag": "str", "ignore_eos": "bool",
    "skip_special_tokens": "bool", "spaces_between_special_tokens": "bool", "no_stop_trim": "bool",
    "stream_interval": "i64", "logit_bias": "map", "sampling_seed": "i64", "custom_params": "any",
    "beam_width": "i64", "watermark": "struct WatermarkRequestConfig", "choice": "seq",
}
#: top-level GenerateRequest fields the simulator reads or routers send; unknown top-level keys are ignored
_TOP_KINDS: dict[str, str] = {
    "rid": "StringOrList", "stream": "bool", "return_logprob": "BoolOrList",
    "logprob_start_len": "Int64OrList", "top_logprobs_num": "Int64OrList", "return_text_in_logprobs": "bool",
    "bootstrap_host": "OptionalStringOrList", "bootstrap_port": "OptionalInt64OrList",
    "bootstrap_room": "OptionalInt64OrList", "priority": "i64", "routing_key": "str", "session_id": "str",
}
_EXPECTED = {"i64": "i64", "f64": "f64", "bool": "a boolean", "str": "a string", "seq": "a sequence",
             "map": "a map"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _unexpected(v: Any) -> str:
    """serde's `Unexpected` display (the decoder's own wording)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    return "sequence" if isinstance(v, list) else "map" if isinstance(v, dict) else type(v).__name__


def _scalar_ok(kind: str, v: Any) -> bool:
    return {
        "i64": _is_int(v), "f64": _is_int(v) or isinstance(v, float), "bool": isinstance(v, bool),
        "str": isinstance(v, str), "seq": isinstance(v, list), "map": isinstance(v, dict),
    }.get(kind, True)


def _kind_error(kind: str, v: Any, key: str = "") -> str | None:
    if v is None or kind == "any":
        return None
    if kind in _EXPECTED:
        if kind == "seq" and isinstance(v, list):
            bad = next((i for i in v if not _is_int(i)), None) if key == "stop_token_ids" else None
            return None if bad is None else f"invalid type: {_unexpected(bad)}, expected i64"
        return None if _scalar_ok(kind, v) else f"invalid type: {_unexpected(v)}, expected {_EXPECTED[kind]}"
    if kind.startswith("struct "):
        return None if isinstance(v, dict) else f"invalid type: {_unexpected(v)}, expected {kind}"
    # X-or-list unions: a scalar of the element type, or a list of them
    elem = {"StringOrList": "str", "OptionalStringOrList": "str", "BoolOrList": "bool",
            "Int64OrList": "i64", "OptionalInt64OrList": "i64"}[kind]
    optional = kind.startswith("Optional")
    items = v if isinstance(v, list) else [v]
    for item in items:
        if item is None and optional:
            continue
        if not _scalar_ok(elem, item):  # a bad element is named; a bad scalar names the whole union
            if isinstance(v, list):
                return f"invalid type: {_unexpected(item)}, expected {_EXPECTED[elem]}"
            return f"invalid type: {_unexpected(v)}, expected a value or an array of values for {kind}"
    return None


def _sampling_error(params: Any) -> str | None:
    if params is None:
        return None
    if not isinstance(params, dict):
        return f"invalid type: {_unexpected(params)}, expected struct SamplingParams"
    for key, value in params.items():
        kind = _SAMPLING_KINDS.get(key)
        if kind is None:
            listed = ", ".join(f"`{f}`" for f in _SAMPLING_KINDS)
            return f"unknown field `{key}`, expected one of {listed}"
        if key == "max_new_tokens" and value is None:
            continue
        if (err := _kind_error(kind, value, key)) is not None:
            return err
    return None


def contract_error(body: dict[str, Any]) -> str | None:
    """The schema decoder's verdict on a body that passed `body_error`, or None."""
    for key, kind in _TOP_KINDS.items():
        if key in body and (err := _kind_error(kind, body[key])) is not None:
            return err
    params = body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        if (err := _sampling_error(p)) is not None:
            return err
    return None


def _pydantic(errors: list[dict[str, Any]]) -> str:
    """FastAPI's RequestValidationError text as SGLang's handler renders it, `f"{str(exc)} {exc.errors()}"`
    (measured against the engine: tests/engine/test_sim_differential.py); the endpoint location FastAPI
    adds to str(exc) names a file on the engine's machine and is left out. The errors themselves are
    pydantic-like, not byte-exact (the JSON decoder's words differ)."""
    n = len(errors)
    head = f"{n} validation error{'s' if n > 1 else ''}:\n" + "\n".join(f"  {e}" for e in errors)
    return f"{head} {errors}"


def validation_text(errors: list[dict[str, Any]]) -> str:
    """A body model's errors as SGLang's 400 message (any endpoint with a pydantic body)."""
    return _pydantic(errors)


def body_error(body: Any) -> str | None:
    """The pydantic body-parse verdict (step 1), or None. `body` is the parsed JSON."""
    if not isinstance(body, dict):
        return _pydantic([{"type": "dataclass_type", "loc": ("body",),
                           "msg": "Input should be a dictionary or an instance of GenerateReqInput",
                           "input": body, "ctx": {"class_name": "GenerateReqInput"}}])
    text, ids, params = body.get("text"), body.get("input_ids"), body.get("sampling_params")
    if text is not None and not (isinstance(text, str) or (isinstance(text, list) and all(
            isinstance(t, str) for t in text))):
        return _pydantic([{"type": "string_type", "loc": ("body", "text", "str"),
                           "msg": "Input should be a valid string", "input": text}])
    if ids is not None:
        rows = ids if ids and isinstance(ids[0], list) else [ids] if isinstance(ids, list) else None
        if rows is None:
            msg = f"Value error, must be list or null; got {type(ids).__name__}"
        elif all(isinstance(r, list) and all(_is_int(i) for i in r) for r in rows):
            msg = ""
        else:
            msg = "Value error, contains non-int64 element"
        if msg:
            return _pydantic([{"type": "value_error", "loc": ("body", "input_ids"), "msg": msg, "input": ids}])
    if params is not None and not isinstance(params, dict | list):
        return _pydantic([{"type": "dict_type", "loc": ("body", "sampling_params", "dict[str,any]"),
                           "msg": "Input should be a valid dictionary", "input": params}])
    return None


def json_error(exc: Exception) -> str:
    return _pydantic([{"type": "json_invalid", "loc": ("body", getattr(exc, "pos", 0)),
                       "msg": "JSON decode error", "input": {}, "ctx": {"error": getattr(exc, "msg", str(exc))}}])


# -- OpenAI request models (pydantic BaseModels: the same 400 "Bad Request" rendering) ----------------------
def model_type_error(model: str, body: Any) -> str:
    return _pydantic([{"type": "model_attributes_type", "loc": ("body",),
                       "msg": "Input should be a valid dictionary or object to extract fields from",
                       "input": body}])


def missing_error(field: str) -> str:
    return _pydantic([{"type": "missing", "loc": ("body", field), "msg": "Field required", "input": None}])


def list_error(field: str, value: Any) -> str:
    return _pydantic([{"type": "list_type", "loc": ("body", field), "msg": "Input should be a valid list",
                       "input": value}])


def pydantic_int_error(field: str, value: Any) -> str:
    return _pydantic([{"type": "int_parsing", "loc": ("body", field),
                       "msg": "Input should be a valid integer", "input": value}])
