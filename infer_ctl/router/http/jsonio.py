"""JSON encode/decode for the hot path: orjson when installed (several times faster), else the stdlib."""

from __future__ import annotations

import json
from typing import Any

#: the Content-Type of every JSON body the router writes
JSON_TYPE = "application/json"

try:  # pragma: no cover - depends on the environment
    import orjson

    def dumps(obj: Any) -> bytes:
        return orjson.dumps(obj)

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    DecodeError: type[Exception] = orjson.JSONDecodeError
except ImportError:  # pragma: no cover

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    DecodeError = ValueError


def openai_error_type(status: int) -> str:
    """OpenAI's error `type` for an HTTP status. Clients branch on it (OpenAI's error-codes guide names
    invalid_request_error, authentication_error-style 401s, rate_limit_error and server_error), so the
    router's own finer reasons (queue full, no worker, ...) stay in the message and in
    inferctl_router_rejected_total{reason}, not here. Every 4xx the client caused - malformed body, 404,
    405, 413, 409 - is invalid_request_error."""
    if status == 401:
        return "authentication_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, message: str) -> bytes:
    """OpenAI-style error document; every router-made error uses it (`type` from the status)."""
    return dumps({"error": {"message": message, "type": openai_error_type(status), "code": status}})


def loads_or_none(data: bytes) -> Any:
    """The JSON of a worker's answer, or None when it is not JSON (feedback is best effort)."""
    try:
        return loads(data)
    except (DecodeError, ValueError):
        return None
