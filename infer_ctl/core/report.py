"""The document every command produces: findings and/or per-node results, an overall status and exit code.

`to_dict()` is the stable `--json` shape documented in docs/json-output.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infer_ctl.core.findings import Finding, Status, overall_status
from infer_ctl.exitcodes import ExitCode

_STATUS_BY_EXIT = {
    ExitCode.OK: Status.OK,
    ExitCode.WARN: Status.WARN,
    ExitCode.FAIL: Status.FAIL,
    ExitCode.UNKNOWN: Status.UNKNOWN,
}


@dataclass
class Report:
    command: str
    profile: str | None
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    duration_s: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    #: per-node results of commands that run things (exec, launch, provision)
    results: list[dict[str, Any]] | None = None
    #: command-specific payload (plan numbers, router status, ...) merged at the top level
    data: dict[str, Any] = field(default_factory=dict)
    #: set by commands whose exit code is not a pure function of findings (exec, provision --plan)
    exit_code_override: ExitCode | None = None

    @property
    def status(self) -> Status:
        if self.exit_code_override is not None:
            return _STATUS_BY_EXIT.get(self.exit_code_override, Status.FAIL)
        return overall_status(self.findings)

    @property
    def exit_code(self) -> ExitCode:
        if self.exit_code_override is not None:
            return self.exit_code_override
        return self.status.exit_code

    def extend(self, findings: Sequence[Finding]) -> None:
        self.findings.extend(findings)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "command": self.command,
            "profile": self.profile,
            "started_at": self.started_at.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "duration_s": round(self.duration_s, 3),
            "status": self.status.value,
            "exit_code": int(self.exit_code),
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.results is not None:
            doc["results"] = self.results
        for key, value in self.data.items():
            doc.setdefault(key, value)
        return doc
