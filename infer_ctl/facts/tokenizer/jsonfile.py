"""JSON files as objects, and the checks of the few JSON values whose type the facts promise.

A parsed document is a `JsonObject`: its values are whatever the file holds, so each parser checks the
values it reads (or lets the wrong shape raise one of `files.SHAPE_ERRORS`, reported as a file problem) and
returns typed facts; no untyped value leaves a parser.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeAlias

from infer_ctl.facts.tokenizer.files import FileProblem

JsonObject: TypeAlias = dict[str, Any]


def _json_loader() -> Callable[[bytes], object]:
    # orjson parses the 8 MB DeepSeek tokenizer.json ~3x faster; it is optional, json is the fallback.
    try:
        import orjson
    except ImportError:
        return json.loads
    return orjson.loads


_loads = _json_loader()


def parse_json_object(data: bytes) -> JsonObject:
    try:
        doc = _loads(data)
    except ValueError as exc:  # orjson's and json's decode errors, and UnicodeDecodeError, are ValueErrors
        raise FileProblem(f"not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise FileProblem("not a JSON object")
    return doc


def canonical_json(value: object) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def token_ids(value: object) -> tuple[int, ...]:
    """An id or a list of ids (configs write eos both ways) as a tuple; None is no ids."""
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    ids: list[int] = []
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"token id(s) {value!r} are not integers")
        ids.append(v)
    return tuple(ids)


def positive_count(value: object, key: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{key} {value!r} is not a positive integer")
    return value
