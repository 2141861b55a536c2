"""Errors of the provisioning layer."""

from __future__ import annotations

from infer_ctl.errors import InferctlError, UsageError


class ProvisionError(InferctlError):
    """A step could not be planned or applied on a node; stops that node (exit 2)."""


class StepFailed(ProvisionError):
    def __init__(self, step: str, message: str, *, remedy: str | None = None) -> None:
        super().__init__(f"{step}: {message}", remedy=remedy)
        self.step = step


class WheelhouseError(UsageError):
    """The local wheelhouse is missing, incomplete or does not match its manifest."""
