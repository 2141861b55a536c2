"""The connector protocol every remote capability goes through, and its one result type."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Command:
    """A command as an argv vector. Quoting happens once, at the edge (`shell()`), with shlex.

    `Command.sh(script)` wraps a shell snippet as `sh -c SCRIPT` for pipelines; the script is still
    passed as one quoted argument, never pasted into another command line.
    """

    argv: tuple[str, ...]

    def __init__(self, *argv: str) -> None:
        if not argv:
            raise ValueError("empty command")
        object.__setattr__(self, "argv", tuple(str(a) for a in argv))

    @classmethod
    def sh(cls, script: str) -> Command:
        return cls("sh", "-c", script)

    def shell(self) -> str:
        return shlex.join(self.argv)

    def __str__(self) -> str:
        return self.shell()


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command was killed by a timeout or signal
    stdout: bytes
    stderr: bytes
    duration: float
    timed_out: bool = False
    command: str = field(default="", compare=False)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def out(self) -> str:
        """stdout decoded leniently: tool output may contain non-UTF-8 bytes."""
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")


@runtime_checkable
class Connector(Protocol):
    """One node. Implementations: `LocalConnector` (here), `SshConnector` (remote.ssh)."""

    node_name: str

    def run(
        self,
        command: Command | Sequence[str],
        *,
        timeout: float | None = None,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult: ...

    def put_file(
        self,
        remote_path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        owner: str | None = None,
        sudo: bool = False,
    ) -> None: ...

    def get_file(self, remote_path: str) -> bytes: ...

    def close(self) -> None: ...


def as_command(command: Command | Sequence[str]) -> Command:
    return command if isinstance(command, Command) else Command(*command)
