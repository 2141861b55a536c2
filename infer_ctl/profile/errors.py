"""Turn pydantic validation errors into one line per problem, naming the field path and suggesting
the closest valid key or value ("did you mean ...")."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from infer_ctl.profile.profile import CrossFieldErrors

Loc = Sequence[str | int]


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _unwrap(tp: Any) -> list[Any]:
    """The concrete types inside Optional/Annotated/Union/list/dict annotations."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(tp) for t in _unwrap(arg)]
    if origin in (list, tuple, set, frozenset):
        return [t for arg in typing.get_args(tp) if arg is not Ellipsis for t in _unwrap(arg)]
    if origin is dict:
        return _unwrap(typing.get_args(tp)[1])
    return [tp]


def model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    """The pydantic model class that holds the field at `loc` (ints index lists, so they are skipped)."""
    current: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        models = [t for t in _unwrap(field.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
        current = models[0] if models else None
    return current


def _suggest(word: str, options: Sequence[str]) -> str:
    match = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _expected_values(ctx: dict[str, Any] | None) -> list[str]:
    expected = str((ctx or {}).get("expected", ""))
    return re.findall(r"'([^']*)'", expected) or re.findall(r"\b[\w.-]+\b", expected)


def format_error(root: type[BaseModel], err: Any) -> list[str]:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    etype = err["type"]
    ctx = err.get("ctx") or {}
    exc = ctx.get("error")
    if isinstance(exc, CrossFieldErrors):
        prefix = loc
        return [f"{format_loc((*prefix, *p.loc))}: {p.message}" for p in exc.problems]
    if etype == "extra_forbidden":
        key = str(loc[-1])
        parent = model_at(root, loc[:-1])
        valid = list(parent.model_fields) if parent else []
        hint = _suggest(key, valid) or (f" (valid keys: {', '.join(valid)})" if valid else "")
        return [f"{format_loc(loc)}: unknown key {key!r}{hint}"]
    if etype in ("literal_error", "enum"):
        options = _expected_values(ctx)
        value = err.get("input")
        hint = _suggest(str(value), options) if isinstance(value, str) else ""
        return [f"{format_loc(loc)}: {value!r} is not one of {', '.join(options)}{hint}"]
    if etype == "missing":
        return [f"{format_loc(loc)}: required field is missing"]
    message = str(err["msg"])
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = err.get("input")
    if (
        etype.endswith("_type")
        or etype.endswith("_parsing")
        or etype
        in (
            "greater_than_equal",
            "less_than_equal",
            "greater_than",
            "less_than",
            "string_pattern_mismatch",
            "too_short",
            "too_long",
            "finite_number",
        )
    ):
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        message = f"{message} (got {shown})"
    return [f"{format_loc(loc)}: {message}"]


def format_validation_error(root: type[BaseModel], exc: ValidationError) -> list[str]:
    lines: list[str] = []
    for err in exc.errors():
        for line in format_error(root, err):
            if line not in lines:
                lines.append(line)
    return lines
