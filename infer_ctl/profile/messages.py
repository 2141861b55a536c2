"""One pydantic error of a profile section as a sentence: what the field wants (never a raw regex),
the closest valid key or value ("did you mean ..."), and a hint for fields users often mistake.

Free of profile.py, so the cross-field rules (node overrides) word their errors the same way.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

Loc = Sequence[str | int]

_NAME = "letters, digits, '.', '_' or '-', starting with a letter or digit"
#: what each pattern-constrained field wants, by its pattern (tests/unit/test_profile_messages.py checks
#: that every pattern of the profile schema is here)
PATTERN_WANTS: dict[str, str] = {
    r"^(\[[0-9a-fA-F:]+\]|[^:\s]+):\d{1,5}$": "HOST:PORT, e.g. 127.0.0.1:8000 (an IPv6 host in brackets: [::1]:8000)",
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$": f"a name of 1 to 63 {_NAME}, e.g. pf-01",
    r"^([A-Za-z0-9_][A-Za-z0-9_.-]*|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f.]*(%[A-Za-z0-9_.-]+)?)$":
        "a host name, IPv4 address or bare IPv6 address, e.g. 10.0.0.11 or ::1 (the SSH login goes in "
        "`user`, the SSH port in `port`)",
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$": f"a name of 1 to 64 {_NAME}, e.g. team-a",
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$": f"a name of 1 to 128 {_NAME}, e.g. support-bot-v1",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an environment variable name (letters, digits and '_', not starting with a "
                                 "digit), e.g. INFERCTL_ROUTER_TOKEN",
    r"^[a-z0-9][a-z0-9-]{0,63}$": "a lower-case HTTP header name of 1 to 64 letters, digits or '-', "
                                  "e.g. x-inferctl-tenant",
    r"^[a-z_][a-z0-9_-]{0,31}$": "a Unix user name (up to 32 lower-case letters, digits, '_' or '-', starting "
                                 "with a letter or '_'), e.g. sglang",
    r"^\d+\.\d+(\.\d+)?([a-z0-9.+-]*)$": "a version number, e.g. 0.5.23",
    r"^[0-9a-fA-F]{64}$": "64 hex digits (the SHA-256 of the key)",
    r"^https?://[^\s/]+(/\S*)?$": "an http:// or https:// URL, e.g. http://127.0.0.1:4318",
    r"^https?://\S+$": "an http:// or https:// URL, e.g. http://10.0.0.5:8000",
}

#: (model, field): what to add when a value is refused, for fields users often confuse with another
FIELD_HINTS: dict[tuple[str, str], str] = {
    ("FabricPolicy", "mtu"): "fabric.mtu is the RoCE/InfiniBand path MTU of the HCA ports; an Ethernet "
                             "MTU such as 1500 or 9000 belongs in fabric.netdev_mtu",
}


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
    """pydantic's "'a', 'b' or 'c'" / "256, 512 or 4096" as the list of values."""
    expected = str((ctx or {}).get("expected", ""))
    return [v.strip().strip("'\"") for v in re.split(r",\s*|\s+or\s+", expected) if v.strip()]


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown[:57] + "..." if len(shown) > 60 else shown


def unknown_key(key: str, parent: type[BaseModel] | None) -> str:
    valid = list(parent.model_fields) if parent else []
    hint = _suggest(key, valid) or (f" (valid keys: {', '.join(valid)})" if valid else "")
    return f"unknown key {key!r}{hint}"


def error_message(root: type[BaseModel], err: Any) -> str:
    """The sentence for one pydantic error `err` of a `root` document (its loc is relative to root)."""
    loc: tuple[str | int, ...] = tuple(err["loc"])
    etype = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    parent = model_at(root, loc[:-1])
    field_hint = FIELD_HINTS.get((parent.__name__, str(loc[-1]))) if parent and loc else None
    tail = f"; {field_hint}" if field_hint else ""
    if etype == "extra_forbidden":
        return unknown_key(str(loc[-1]), parent)
    if etype in ("literal_error", "enum"):
        options = _expected_values(ctx)
        if isinstance(value, str) and value in options:
            # only a number choice refuses its own spelling: `mtu: '4096'` is the string, not the number
            return f"{value!r} is a string: write {value} without quotes (one of {', '.join(options)})"
        hint = _suggest(str(value), options) if isinstance(value, str) else ""
        return f"{value!r} is not one of {', '.join(options)}{hint}{tail}"
    if etype == "missing":
        return "required field is missing"
    if etype == "string_pattern_mismatch":
        wants = PATTERN_WANTS.get(str(ctx.get("pattern")), f"a string matching {ctx.get('pattern')}")
        return f"want {wants} (got {_shown(value)})"
    message = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if etype.endswith(("_type", "_parsing")) or etype in (
        "greater_than_equal", "less_than_equal", "greater_than", "less_than", "too_short", "too_long",
        "finite_number",
    ):
        message = f"{message} (got {_shown(value)})"
    return message + tail
