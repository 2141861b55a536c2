"""Diffs shown in plans: unified diffs for files, `before -> after` for settings."""

from __future__ import annotations

import difflib
from collections.abc import Mapping


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def file_diff(path: str, current: bytes | None, desired: bytes) -> str:
    """A unified diff from the node's file (or /dev/null when absent) to the desired content."""
    old = _lines(current)
    new = _lines(desired)
    lines = list(
        difflib.unified_diff(
            old,
            new,
            fromfile="/dev/null" if current is None else f"{path} (node)",
            tofile=f"{path} (desired)",
        )
    )
    # difflib leaves lines without a trailing newline glued to the next one; terminate every line.
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def settings_diff(before: Mapping[str, str | None], after: Mapping[str, str]) -> str:
    """One line per setting that differs: `key: before -> after` (missing shown as <unset>)."""
    rows = []
    for key, want in after.items():
        have = before.get(key)
        if have != want:
            rows.append(f"{key}: {'<unset>' if have is None else have} -> {want}")
    return "\n".join(rows)
