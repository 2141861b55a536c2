"""Remote failures, translated at the boundary into plain reasons with a next step.

Connection-level errors keep RemoteError's exit code 3 (UNKNOWN: we could not look). Errors that are
a verdict rather than a blind spot exit 2 (FAIL): a changed host key (possible impostor), and sudo
refusing a privileged command.
"""

from __future__ import annotations

from infer_ctl.errors import InferctlError, RemoteError
from infer_ctl.exitcodes import ExitCode


class UnreachableError(RemoteError):
    """DNS failure, connection refused, timeout, no route, or a broken SSH handshake."""


class DnsError(UnreachableError):
    pass


class ConnectionRefusedRemoteError(UnreachableError):
    pass


class ConnectTimeoutError(UnreachableError):
    pass


class ConnectionLostError(UnreachableError):
    """The transport died after it was established (node rebooted, network cut)."""


class SessionRefusedError(ConnectionLostError):
    """sshd refused one more session channel on a live connection (MaxSessions): that step did not run."""


class AuthError(RemoteError):
    """No offered key was accepted."""


class HostKeyError(RemoteError):
    pass


class HostKeyUnknownError(HostKeyError):
    def __init__(self, message: str, *, remedy: str, fingerprint: str) -> None:
        super().__init__(message, remedy=remedy)
        self.fingerprint = fingerprint


class HostKeyChangedError(HostKeyError):
    """Always a hard failure: the node may be an impostor, or was reinstalled."""

    exit_code = ExitCode.FAIL


class SudoError(RemoteError):
    """sudo refused or is missing: the command did not run."""

    exit_code = ExitCode.FAIL


class SudoPasswordRequiredError(SudoError):
    pass


class SudoPasswordRejectedError(SudoPasswordRequiredError):
    """The password from ssh.sudo_password_env was wrong (offered once: sudo asked again)."""


class SudoNotAllowedError(SudoError):
    pass


class SudoMissingError(SudoError):
    pass


class TransferError(RemoteError):
    """A file upload/download failed (permission, missing directory, disk full)."""

    exit_code = ExitCode.FAIL


class NodeSkippedError(RemoteError):
    """The operation was not run on this node (--fail-fast stopped the fan-out, or Ctrl-C)."""


class UnexpectedNodeError(InferctlError):
    """A bug surfaced on one node; the fleet keeps going and the node is reported as failed."""

    exit_code = ExitCode.FAIL
