"""The audit history file (`--history`, one JSON record per line) read newest first.

One reader for every consumer (`audit --since-last`, the remediation state, `check spec`'s last tokenizer
result): a line that is not a JSON object (a torn write, a hand edit) is skipped, never fatal, and a
missing or unreadable file reads as no history yet.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("infer_ctl.history")


def records_newest_first(path: str | os.PathLike[str], profile_name: str | None = None) -> Iterator[dict[str, Any]]:
    """The history's records (of `profile_name` when given), newest first."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return
    for n, line in enumerate(reversed(lines)):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if line.strip():  # said, not fatal: the records around it are still the history
                log.warning("audit history %s: line %d is not a JSON record (a torn write?): skipped",
                            path, len(lines) - n)
            continue
        if isinstance(record, dict) and (profile_name is None or record.get("profile") == profile_name):
            yield record
