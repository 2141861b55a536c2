"""File transfer over a plain exec channel, shared by the connectors: atomic writes (temp file in the
target's directory, then rename) for sudo and for nodes without SFTP, and reads with `cat`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infer_ctl.remote.base import Command
from infer_ctl.remote.errors import TransferError

if TYPE_CHECKING:
    from infer_ctl.remote.base import Connector

# Run as `sh -c SCRIPT inferctl-put PATH MODE OWNER` (under sudo) with the file's bytes on stdin.
# The temp file lives next to the target so `mv` is a rename on one filesystem: readers see the old
# file or the new one, never half of it.
SUDO_PUT_SCRIPT = r"""set -eu
d=$(dirname -- "$1"); b=$(basename -- "$1")
t="$d/.$b.inferctl.$$.tmp"
trap 'rm -f -- "$t"' EXIT
umask 077
cat > "$t"
chmod "$2" "$t"
if [ -n "$3" ]; then chown "$3" "$t"; fi
mv -f -- "$t" "$1"
trap - EXIT
"""


def put_file_error(node: str, path: str, reason: str) -> TransferError:
    reason = reason.strip().splitlines()[-1] if reason.strip() else "unknown error"
    return TransferError(
        f"{node}: cannot write {path}: {reason}",
        remedy="check that the directory exists and is writable (use sudo for system paths)",
    )


# Run as `sh -c SCRIPT inferctl-get PATH`: the file's bytes on stdout (exact: stdout is not decoded).
GET_SCRIPT = r"""[ -d "$1" ] && exit 3
[ -e "$1" ] || exit 4
exec cat -- "$1"
"""


def put_file_via_sudo(conn: Connector, remote_path: str, data: bytes, mode: int, owner: str | None) -> None:
    """Write through `sudo -n sh -c SUDO_PUT_SCRIPT` with the bytes on stdin: SFTP (or our own process)
    cannot write root-owned paths, a root shell writing a temp file next to the target can."""
    put_file_via_shell(conn, remote_path, data, mode, owner, sudo=True)


def put_file_via_shell(
    conn: Connector, remote_path: str, data: bytes, mode: int, owner: str | None, *, sudo: bool = False
) -> None:
    """The same atomic write over a plain exec channel: for sudo, and where the node serves no SFTP."""
    result = conn.run(
        Command("sh", "-c", SUDO_PUT_SCRIPT, "inferctl-put", remote_path, f"{mode:o}", owner or ""),
        sudo=sudo,
        stdin=data,
    )
    if not result.ok:
        raise put_file_error(conn.node_name, remote_path, result.err)


def get_file_via_shell(conn: Connector, remote_path: str) -> bytes:
    """Read a file over a plain exec channel (`cat`), where the node serves no SFTP."""
    result = conn.run(Command("sh", "-c", GET_SCRIPT, "inferctl-get", remote_path))
    if result.ok:
        return result.stdout
    if result.exit_code == 3:
        raise TransferError(f"{conn.node_name}: {remote_path} is a directory", remedy="name a file")
    if result.exit_code == 4:
        raise TransferError(
            f"{conn.node_name}: {remote_path} does not exist", remedy="check the path on the node"
        )
    reason = result.err.strip().splitlines()[-1] if result.err.strip() else f"exit {result.exit_code}"
    raise TransferError(
        f"{conn.node_name}: cannot read {remote_path}: {reason}", remedy="check permissions on the node"
    )
