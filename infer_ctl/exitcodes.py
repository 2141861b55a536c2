"""Exit codes users script against (docs/json-output.md and docs/architecture.md, "Contracts")."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    WARN = 1  # warnings only, or `provision --plan` with changes pending
    FAIL = 2  # at least one failure, or the command failed on some node
    UNKNOWN = 3  # a node unreachable / a fact not gathered, and nothing failed
    USAGE = 64  # usage error or invalid profile (EX_USAGE from sysexits.h)
    INTERRUPTED = 130  # 128 + SIGINT
