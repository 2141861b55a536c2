"""JSON encode/decode for the hot path: orjson when installed (several times faster), else the stdlib."""

from __future__ import annotations

import json
from typing import Any

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


def error_body(status: int, message: str, kind: str) -> bytes:
    """OpenAI-style error document; every router-made error uses it."""
    return dumps({"error": {"message": message, "type": kind, "code": status}})


def loads_or_none(data: bytes) -> Any:
    """The JSON of a worker's answer, or None when it is not JSON (feedback is best effort)."""
    try:
        return loads(data)
    except (DecodeError, ValueError):
        return None
