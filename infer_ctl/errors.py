"""The one exception hierarchy of inferctl.

Every expected failure is an ``InferctlError`` carrying an exit code (docs/architecture.md, "Contracts") and a remedy, so
the CLI can print one line that says what went wrong and what to do next. Anything else is a bug and is
shown with a traceback in the debug log.
"""

from __future__ import annotations

from infer_ctl.exitcodes import ExitCode


class InferctlError(Exception):
    """Root of all expected errors. ``remedy`` says what the user should do next."""

    exit_code: int = ExitCode.FAIL

    def __init__(self, message: str, *, remedy: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.remedy = remedy
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UsageError(InferctlError):
    """Bad command-line input (exit 64)."""

    exit_code = ExitCode.USAGE


class ProfileError(InferctlError):
    """The profile cannot be found, parsed or validated (exit 64)."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, remedy: str | None = None, errors: list[str] | None = None) -> None:
        super().__init__(message, remedy=remedy)
        #: every field-level problem, one line each ("nodes[2].roles[0]: ...")
        self.errors = errors or [message]


class RemoteError(InferctlError):
    """A node could not be reached or a remote operation failed. Per-node, never fatal to the fleet."""

    exit_code = ExitCode.UNKNOWN


class MissingExtraError(InferctlError):
    """An optional dependency (an extra) is not installed."""

    exit_code = ExitCode.USAGE

    def __init__(self, module: str, extra: str, purpose: str) -> None:
        super().__init__(
            f"{purpose} needs the Python module '{module}', which is not installed",
            remedy=f"pip install 'inferctl[{extra}]'",
        )
