"""The connector for the machine inferctl runs on (`connection: local`): subprocess, same semantics
as SSH: timeouts kill the whole process group, sudo goes through `sudo -n` (or a password on stdin)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from infer_ctl.atomicfile import write_atomic
from infer_ctl.remote.base import Command, CommandResult, as_command
from infer_ctl.remote.commandline import SudoMode, build_argv, raise_for_sudo
from infer_ctl.remote.errors import TransferError
from infer_ctl.remote.putfile import put_file_error, put_file_via_sudo

_KILL_GRACE_S = 2.0


class LocalConnector:
    def __init__(
        self, node_name: str, *, sudo_mode: SudoMode | None = None, command_timeout: float = 120.0
    ) -> None:
        self.node_name = node_name
        self.sudo_mode = sudo_mode or SudoMode()
        self._command_timeout = command_timeout
        self._lock = threading.Lock()
        self._procs: set[subprocess.Popen[bytes]] = set()

    def run(
        self,
        command: Command | Sequence[str],
        *,
        timeout: float | None = None,
        sudo: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        cmd = as_command(command)
        limit = self._command_timeout if timeout is None else timeout
        argv, prefix = build_argv(cmd, sudo=sudo, sudo_mode=self.sudo_mode, env=env)
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group, so a timeout kills children too
            )
        except FileNotFoundError:
            result = CommandResult(
                127, b"", f"{argv[0]}: command not found\n".encode(), 0.0, command=cmd.shell()
            )
            if sudo:
                raise_for_sudo(self.node_name, result, self.sudo_mode)
            return result
        with self._lock:
            self._procs.add(proc)
        timed_out = False
        try:
            try:
                out, err = proc.communicate(prefix + (stdin or b""), timeout=limit)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill_group(proc)
                out, err = proc.communicate()
        finally:
            with self._lock:
                self._procs.discard(proc)
        code = None if timed_out or proc.returncode < 0 else proc.returncode
        result = CommandResult(code, out, err, time.monotonic() - started, timed_out, command=cmd.shell())
        if sudo:
            raise_for_sudo(self.node_name, result, self.sudo_mode)
        return result

    @staticmethod
    def _kill_group(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        # children may outlive the leader; the group id stays valid while any member lives
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def put_file(
        self,
        remote_path: str,
        data: bytes,
        *,
        mode: int = 0o644,
        owner: str | None = None,
        sudo: bool = False,
    ) -> None:
        if sudo and self.sudo_mode.enabled:
            put_file_via_sudo(self, remote_path, data, mode, owner)
            return
        try:
            write_atomic(remote_path, data, mode=mode, owner=owner, make_parents=False)
        except (OSError, LookupError) as exc:
            raise put_file_error(
                self.node_name, remote_path, getattr(exc, "strerror", None) or str(exc)
            ) from None

    def get_file(self, remote_path: str) -> bytes:
        try:
            return Path(remote_path).read_bytes()
        except FileNotFoundError:
            raise TransferError(
                f"{self.node_name}: {remote_path} does not exist", remedy="check the path"
            ) from None
        except OSError as exc:
            raise TransferError(
                f"{self.node_name}: cannot read {remote_path}: {exc.strerror}", remedy="check permissions"
            ) from None

    def abort(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

    def close(self) -> None:
        self.abort()
