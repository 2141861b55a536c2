"""The plan model: one `PlanEntry` per (step, subject) per node, and how a fleet's plan maps to an exit code.

Kinds: OK (already right), CHANGE
(inferctl will change it; a unified diff for files, before -> after for settings), REBOOT_REQUIRED,
MANUAL (inferctl will not do it; instructions in `remedy`), WARN, ERROR (the probe or a precondition
failed). `--apply` executes CHANGE entries only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from infer_ctl.exitcodes import ExitCode


class EntryKind(StrEnum):
    OK = "ok"
    CHANGE = "change"
    REBOOT_REQUIRED = "reboot_required"
    MANUAL = "manual"
    WARN = "warn"
    ERROR = "error"
    SKIP = "skip"


#: kinds that mean "this node is not in the desired state yet" (plan exit code 1)
PENDING_KINDS = frozenset({EntryKind.CHANGE, EntryKind.REBOOT_REQUIRED, EntryKind.MANUAL, EntryKind.WARN})


@dataclass(frozen=True)
class PlanEntry:
    """One planned (or verified) item. `commands` are shown in the plan exactly as apply runs them."""

    node: str
    step: str
    subject: str
    kind: EntryKind
    summary: str
    diff: str = ""
    before: str | None = None
    after: str | None = None
    commands: tuple[str, ...] = ()
    needs_sudo: bool = False
    remedy: str | None = None
    details: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", EntryKind(self.kind))
        if not isinstance(self.details, MappingProxyType):
            object.__setattr__(self, "details", MappingProxyType(dict(self.details)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "subject": self.subject,
            "kind": self.kind.value,
            "summary": self.summary,
            "diff": self.diff or None,
            "before": self.before,
            "after": self.after,
            "commands": list(self.commands),
            "needs_sudo": self.needs_sudo,
            "remedy": self.remedy,
            "details": dict(self.details),
        }


class NodeState(StrEnum):
    """Outcome of one node: in the desired state, changes pending, applied, failed, unreachable, or
    skipped (not attempted: --fail-fast stopped the fleet after another node failed)."""

    OK = "ok"
    PENDING = "pending"
    APPLIED = "applied"
    ERROR = "error"
    UNREACHABLE = "unreachable"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class NodePlan:
    node: str
    entries: tuple[PlanEntry, ...] = ()
    #: set when the node could not be reached, or when a step stopped the node
    error: str | None = None
    unreachable: bool = False
    #: not attempted (--fail-fast); `error` says why
    skipped: bool = False
    #: CHANGE entries that were executed (apply only)
    applied: tuple[PlanEntry, ...] = ()

    @property
    def state(self) -> NodeState:
        if self.unreachable:
            return NodeState.UNREACHABLE
        if self.skipped:
            return NodeState.SKIPPED
        if self.error or any(e.kind is EntryKind.ERROR for e in self.entries):
            return NodeState.ERROR
        if any(e.kind in PENDING_KINDS for e in self.entries):
            return NodeState.PENDING
        return NodeState.APPLIED if self.applied else NodeState.OK

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in self.entries:
            out[entry.kind.value] = out.get(entry.kind.value, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "state": self.state.value,
            "error": self.error,
            "counts": self.counts(),
            "applied": [f"{e.step}:{e.subject}" for e in self.applied],
            "entries": [e.to_dict() for e in self.entries],
        }


def fleet_exit_code(plans: Iterable[NodePlan]) -> ExitCode:
    """0 nothing to do, 1 changes (or manual work, reboots, warnings) pending, 2 errors, 3 unreachable.

    Errors outrank unreachable nodes and unreachable outranks pending, as in docs/architecture.md ("3: some node
    unreachable ... and nothing failed"). A skipped node was not looked at: it counts like unreachable.
    """
    states = {p.state for p in plans}
    if NodeState.ERROR in states:
        return ExitCode.FAIL
    if NodeState.UNREACHABLE in states or NodeState.SKIPPED in states:
        return ExitCode.UNKNOWN
    if NodeState.PENDING in states:
        return ExitCode.WARN
    return ExitCode.OK

