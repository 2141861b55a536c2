"""Files over one SSH connection: SFTP when the node serves it, the shell (an exec channel) when not.

SFTP is started once per connection and kept open (one channel) for the run's later transfers. Two
situations make that channel a problem, and both are handled here rather than failing the step:
- the node serves no sftp subsystem (`Subsystem sftp` missing from sshd_config, or its server fails to
  start): paramiko reports "Channel closed." / "EOF during negotiation". Transfers then go over the
  shell for the rest of the run (putfile.put_file_via_shell / get_file_via_shell: the same atomic
  temp-file-and-rename write, `cat` for reads);
- the node allows fewer sessions per connection than are open (sshd `MaxSessions`, 1 on some hardened
  images): an idle SFTP channel is given back (`release_idle`) when a command needs the session.
"""

from __future__ import annotations

import contextlib
import stat
import threading
import uuid
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import paramiko

from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import ConnectionLostError, TransferError
from infer_ctl.remote.putfile import get_file_via_shell, put_file_error, put_file_via_shell

if TYPE_CHECKING:
    from infer_ctl.remote.base import Connector

# chown and rename in one command: outside the SFTP lock, so a node that allows one session at a time
# can have the idle SFTP channel closed for it; the temp file is removed if either fails
_CHOWN_AND_RENAME = r"""chown -- "$1" "$2" && mv -f -- "$2" "$3" && exit 0
rc=$?; rm -f -- "$2"; exit $rc
"""


class SftpUnavailableError(TransferError):
    """The node serves no usable sftp subsystem (internal: transfers fall back to the shell)."""


class SftpFiles:
    def __init__(
        self, conn: Connector, transport: paramiko.Transport, lost: Callable[[BaseException | None], ConnectionLostError]
    ) -> None:
        self._conn = conn
        self._transport = transport
        self._lost = lost
        self._lock = threading.Lock()
        self._sftp: paramiko.SFTPClient | None = None
        #: why SFTP could not be started on this connection (then the shell is used), or None
        self.unavailable: str | None = None

    @property
    def node_name(self) -> str:
        return self._conn.node_name

    def _client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                client = paramiko.SFTPClient.from_transport(self._transport)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if not self._transport.is_active():
                    raise self._lost(exc) from None
                self.unavailable = str(exc) or type(exc).__name__
                raise SftpUnavailableError(
                    f"{self.node_name}: cannot start SFTP: {self.unavailable}",
                    remedy="enable the sftp subsystem in the node's sshd_config (Subsystem sftp internal-sftp)",
                ) from None
            if client is None:
                raise self._lost(None)
            self._sftp = client
        return self._sftp

    def put(self, remote_path: str, data: bytes, mode: int, owner: str | None) -> None:
        if self.unavailable is None:
            try:
                self._put_sftp(remote_path, data, mode, owner)
                return
            except SftpUnavailableError:
                pass  # self.unavailable is set: the shell from now on
        put_file_via_shell(self._conn, remote_path, data, mode, owner)

    def _put_sftp(self, remote_path: str, data: bytes, mode: int, owner: str | None) -> None:
        path = PurePosixPath(remote_path)
        tmp = str(path.with_name(f".{path.name}.inferctl-{uuid.uuid4().hex[:12]}.tmp"))
        with self._lock:
            sftp = self._client()
            try:
                with sftp.open(tmp, "wb") as fh:
                    fh.set_pipelined(True)
                    fh.write(data)
                sftp.chmod(tmp, mode)
                if not owner:
                    sftp.posix_rename(tmp, remote_path)
                    return
            except OSError as exc:
                with contextlib.suppress(OSError):
                    sftp.remove(tmp)
                raise put_file_error(self.node_name, remote_path, str(exc)) from None
            except Exception:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
                raise
        result = self._conn.run(
            Command("sh", "-c", _CHOWN_AND_RENAME, "inferctl-chown", owner, tmp, remote_path), timeout=30
        )
        if not result.ok:
            raise put_file_error(self.node_name, remote_path, result.err)

    def get(self, remote_path: str) -> bytes:
        if self.unavailable is None:
            try:
                return self._get_sftp(remote_path)
            except SftpUnavailableError:
                pass
        return get_file_via_shell(self._conn, remote_path)

    def _get_sftp(self, remote_path: str) -> bytes:
        with self._lock:
            sftp = self._client()
            try:
                if stat.S_ISDIR(sftp.stat(remote_path).st_mode or 0):
                    raise TransferError(f"{self.node_name}: {remote_path} is a directory", remedy="name a file")
                with sftp.open(remote_path, "rb") as fh:
                    fh.prefetch()
                    return fh.read()
            except FileNotFoundError:
                raise TransferError(
                    f"{self.node_name}: {remote_path} does not exist", remedy="check the path on the node"
                ) from None
            except OSError as exc:
                raise TransferError(
                    f"{self.node_name}: cannot read {remote_path}: {exc}",
                    remedy="check permissions on the node",
                ) from None

    def release_idle(self) -> bool:
        """Close the SFTP channel if it is open and no transfer is using it; True if one was closed."""
        if self._sftp is None or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._sftp is None:
                return False
            self.close()
            return True
        finally:
            self._lock.release()

    def close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
