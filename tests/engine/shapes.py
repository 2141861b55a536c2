"""A generic "shape" comparison for the differential test (test_sim_differential.py): two JSON documents
have the same shape when they have the same keys, nested, with values of the same JSON types. Values are
not compared (ids, timestamps and sampled text differ between any two servers); where a value is
deterministic the test compares it exactly, beside this.

A list's shape is the union of its elements' shapes, so n choices compare like one. Differences are
strings naming a JSON path (`$.choices[].message.tool_calls`), so an expected difference is listed once,
as a glob, with its reason (`DELIBERATE` in the test, the table in docs/simulator.md).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    return "list" if isinstance(value, list) else "object" if isinstance(value, dict) else type(value).__name__


def shape_diff(real: Any, sim: Any, path: str = "$") -> list[str]:
    """Where `sim` departs from `real`'s shape: "missing PATH" (only SGLang has it), "extra PATH" (only
    the simulator), "type PATH: real/sim" (the same key, another JSON type)."""
    kr, ks = kind(real), kind(sim)
    if kr != ks:
        return [f"type {path}: {kr}/{ks}"]
    if kr == "object":
        out = [f"missing {path}.{k}" for k in real if k not in sim]
        out += [f"extra {path}.{k}" for k in sim if k not in real]
        for k in real:
            if k in sim:
                out += shape_diff(real[k], sim[k], f"{path}.{k}")
        return out
    if kr == "list" and real and sim:
        return shape_diff(_merge(real), _merge(sim), f"{path}[]")
    return []


def _merge(items: list[Any]) -> Any:
    """One element standing for a list: objects merged key by key (the union of their keys)."""
    if not all(isinstance(i, dict) for i in items):
        return items[0]
    merged: dict[str, Any] = {}
    for item in items:
        for k, v in item.items():
            if isinstance(merged.get(k), dict) and isinstance(v, dict):
                merged[k] = _merge([merged[k], v])
            elif merged.get(k) is None:  # a null in one element, a value in another: the value's type
                merged[k] = v
    return merged


def unexplained(diffs: Iterable[str], deliberate: Mapping[str, str]) -> list[str]:
    """The differences no glob of `deliberate` (glob -> reason) covers."""
    return [d for d in diffs if not any(fnmatch.fnmatchcase(d, pattern) for pattern in deliberate)]
