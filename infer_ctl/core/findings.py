"""Findings: the unit of judgement every check produces, and their aggregation to one status."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from infer_ctl.core.finding_codes import code_for
from infer_ctl.exitcodes import ExitCode


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    UNKNOWN = "unknown"
    SKIP = "skip"

    @property
    def exit_code(self) -> ExitCode:
        return _EXIT_BY_STATUS[self]


# FAIL outranks UNKNOWN: "unknown" means "could not tell, and nothing failed" (docs/architecture.md, "Contracts").
_SEVERITY = {Status.SKIP: 0, Status.OK: 0, Status.WARN: 1, Status.UNKNOWN: 2, Status.FAIL: 3}
_EXIT_BY_STATUS = {
    Status.OK: ExitCode.OK,
    Status.SKIP: ExitCode.OK,
    Status.WARN: ExitCode.WARN,
    Status.UNKNOWN: ExitCode.UNKNOWN,
    Status.FAIL: ExitCode.FAIL,
}


def worst(statuses: Iterable[Status]) -> Status:
    """The overall status of a set: fail > unknown > warn > ok; skips alone count as ok."""
    result = Status.OK
    for status in statuses:
        if _SEVERITY[status] > _SEVERITY[result]:
            result = status
    return result


def _freeze(details: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(details or {}))


@dataclass(frozen=True)
class Finding:
    """One judged fact: check id (stable, dotted), node, subject (GPU3, mlx5_0, pf-01->dc-02, ...)."""

    check: str
    node: str
    subject: str
    status: Status
    message: str
    details: Mapping[str, Any] = field(default_factory=lambda: _freeze(None))
    remedy: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        if not isinstance(self.details, MappingProxyType):
            object.__setattr__(self, "details", _freeze(self.details))

    @classmethod
    def make(
        cls,
        status: Status,
        check: str,
        node: str,
        subject: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        remedy: str | None = None,
    ) -> Finding:
        return cls(check, node, subject, status, message, _freeze(details), remedy)

    @classmethod
    def ok(cls, check: str, node: str, subject: str, message: str, **kw: Any) -> Finding:
        return cls.make(Status.OK, check, node, subject, message, **kw)

    @classmethod
    def warn(cls, check: str, node: str, subject: str, message: str, **kw: Any) -> Finding:
        return cls.make(Status.WARN, check, node, subject, message, **kw)

    @classmethod
    def fail(cls, check: str, node: str, subject: str, message: str, **kw: Any) -> Finding:
        return cls.make(Status.FAIL, check, node, subject, message, **kw)

    @classmethod
    def unknown(cls, check: str, node: str, subject: str, message: str, **kw: Any) -> Finding:
        return cls.make(Status.UNKNOWN, check, node, subject, message, **kw)

    @classmethod
    def skip(cls, check: str, node: str, subject: str, message: str, **kw: Any) -> Finding:
        return cls.make(Status.SKIP, check, node, subject, message, **kw)

    @property
    def code(self) -> str | None:
        """The check's stable code (core/finding_codes.py), e.g. IC-GPU-018 for every gpu.xid finding."""
        return code_for(self.check)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "code": self.code,
            "node": self.node,
            "subject": self.subject,
            "status": self.status.value,
            "message": self.message,
            "details": _jsonable(self.details),
            "remedy": self.remedy,
        }


_SCALARS = (str, int, float, bool, type(None))


def _jsonable(value: Any) -> Any:
    # exact-type checks first: an audit serialises thousands of findings, and isinstance() against the
    # Mapping ABC is the slow path
    if type(value) in _SCALARS:
        return value
    if type(value) is dict or isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    return value


def overall_status(findings: Iterable[Finding]) -> Status:
    return worst(f.status for f in findings)

