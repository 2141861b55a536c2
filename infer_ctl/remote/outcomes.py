"""Turning per-node outcomes into the documented results and exit codes (exec, nodes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from infer_ctl.exitcodes import ExitCode
from infer_ctl.remote.base import CommandResult
from infer_ctl.remote.fleet import NodeOutcome


def combine_exit_codes(codes: Iterable[int]) -> ExitCode:
    """FAIL beats UNKNOWN beats OK: "3 if any was unreachable and none failed"."""
    seen = set(codes)
    if ExitCode.FAIL in seen or any(c not in (ExitCode.OK, ExitCode.UNKNOWN) for c in seen):
        return ExitCode.FAIL
    if ExitCode.UNKNOWN in seen:
        return ExitCode.UNKNOWN
    return ExitCode.OK


def command_failed(outcome: NodeOutcome[CommandResult]) -> bool:
    return outcome.error is not None or outcome.value is None or not outcome.value.ok


def exec_exit_code(outcomes: Sequence[NodeOutcome[CommandResult]]) -> ExitCode:
    codes = []
    for o in outcomes:
        if o.error is not None:
            codes.append(int(o.error.exit_code))
        else:
            codes.append(ExitCode.OK if o.value is not None and o.value.ok else ExitCode.FAIL)
    return combine_exit_codes(codes)


def exec_result(outcome: NodeOutcome[CommandResult], timeout: float) -> dict[str, Any]:
    """One entry of `results` (docs/remote.md). Output is decoded as UTF-8 with U+FFFD for bad bytes."""
    res = outcome.value
    error = remedy = None
    if outcome.error is not None:
        error, remedy = outcome.error.message, outcome.error.remedy
    elif res is not None and res.timed_out:
        error = f"timed out after {timeout:g}s; the command was stopped"
        remedy = "raise --timeout (or ssh.command_timeout_s), or find out why the command hangs"
    return {
        "node": outcome.node.name,
        "host": outcome.node.host,
        "ok": outcome.error is None and res is not None and res.ok,
        # null, not timeout(1)'s 124/137, when the command was stopped: it never chose an exit code
        "exit_code": res.exit_code if res is not None and not res.timed_out else None,
        "stdout": res.out if res is not None else "",
        "stderr": res.err if res is not None else "",
        "duration_s": round(res.duration if res is not None else outcome.duration_s, 3),
        "error": error,
        #: what to do about `error` (None when there is none)
        "remedy": remedy,
    }
