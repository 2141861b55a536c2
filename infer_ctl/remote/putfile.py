"""Atomic file writes shared by the connectors: temp file in the target's directory, then rename."""

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


def put_file_via_sudo(conn: Connector, remote_path: str, data: bytes, mode: int, owner: str | None) -> None:
    """Write through `sudo -n sh -c SUDO_PUT_SCRIPT` with the bytes on stdin: SFTP (or our own process)
    cannot write root-owned paths, a root shell writing a temp file next to the target can."""
    result = conn.run(
        Command("sh", "-c", SUDO_PUT_SCRIPT, "inferctl-put", remote_path, f"{mode:o}", owner or ""),
        sudo=True,
        stdin=data,
    )
    if not result.ok:
        raise put_file_error(conn.node_name, remote_path, result.err)
