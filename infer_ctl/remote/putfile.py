"""Atomic file writes shared by the connectors: temp file in the target's directory, then rename."""

from __future__ import annotations

from infer_ctl.remote.errors import TransferError

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
