"""What the fleet controllers (`spec control`, `pd control`) share: one decision record posted to the router
and appended to the history file, and the round loop."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from infer_ctl.atomicfile import append_line
from infer_ctl.errors import InferctlError


def append_action(history: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """One JSON line, appended the audit history's own way (atomicfile.append_line)."""
    append_line(history, json.dumps(record, separators=(",", ":")))


def post_action(client: Any, path: str, history: str | os.PathLike[str] | None, kind: str, profile_name: str,
                rec: dict[str, Any], *, timespec: str = "seconds") -> dict[str, Any]:
    """Stamp a decision, tell the router (`POST path`) and append it to the history (JSON lines)."""
    rec = {"ts": datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z"), **rec}
    try:
        client.call("POST", path, rec)
    except InferctlError as exc:  # the router went away: the history and the output still have it
        rec["router_error"] = exc.message
    if history is not None:
        append_action(history, {"kind": kind, "profile_name": profile_name, **rec})
    return rec


def run_rounds(tick: Callable[[], list[dict[str, Any]]], interval_s: float, *, rounds: int | None = None,
               stop: Callable[[], bool] = lambda: False,
               on_records: Callable[[list[dict[str, Any]]], None] = lambda _r: None) -> None:
    """Call `tick` every `interval_s` (measured from each round's start) until `stop()` or `rounds`."""
    n = 0
    while not stop() and (rounds is None or n < rounds):
        started = time.monotonic()
        on_records(tick())
        n += 1
        if rounds is not None and n >= rounds:
            break
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
