"""Reading and writing files on a node through a Connector.

Writes are atomic (the connector's put_file writes a temp file in the target directory and renames it)
and keep a timestamped backup of the previous content beside the file, under a name no loader picks up.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from infer_ctl.core.provision.desired import ManagedFile, backup_path
from infer_ctl.provision.errors import ProvisionError
from infer_ctl.remote.base import Command, CommandResult, Connector

# one round trip for both: the stat line, then the content
_READ_WITH_STAT = '[ -e "$1" ] || exit 3; stat -c "%a %U %G" -- "$1" && exec cat -- "$1"'
MISSING = 3


def run_checked(conn: Connector, command: Command, *, sudo: bool, what: str, timeout: float = 120) -> CommandResult:
    result = conn.run(command, sudo=sudo, timeout=timeout)
    if not result.ok:
        detail = (result.err or result.out).strip().splitlines()[-1:] or ["no output"]
        reason = "timed out" if result.timed_out else f"exit {result.exit_code}"
        raise ProvisionError(
            f"{what} failed on {conn.node_name} ({reason}): {detail[0]}",
            remedy=f"run `{command.shell()}` on the node to see why, fix it, then rerun provision",
        )
    return result


def read_file_and_stat(conn: Connector, path: str, *, sudo: bool) -> tuple[bytes | None, str | None]:
    """(content, `<octal mode> <user> <group>`), or (None, None) when the file does not exist."""
    result = conn.run(Command("sh", "-c", _READ_WITH_STAT, "sh", path), sudo=sudo, timeout=60)
    if result.exit_code == MISSING:
        return None, None
    if not result.ok:
        raise ProvisionError(
            f"cannot read {path} on {conn.node_name}: {result.err.strip() or result.exit_code}",
            remedy="check that the provisioning user can read it (ssh.sudo: true for root-owned files)",
        )
    stat_line, _, content = result.stdout.partition(b"\n")
    return content, stat_line.decode().strip()


def expected_stat(file: ManagedFile) -> str:
    return f"{file.mode:o} {file.owner} {file.group}"


#: the temp files an atomic write leaves when it is interrupted (the process killed, the connection
#: lost): the SFTP put's `.<name>.inferctl-<hex>.tmp`, the shell put's `.<name>.inferctl.<pid>.tmp`
#: (remote/transfer.py, remote/putfile.py), upload_file's parts and join file (below)
TEMP_PATTERNS = (".{name}.inferctl-*.tmp", ".{name}.inferctl.*.tmp", ".{name}.inferctl-part*", "{name}.inferctl-join.tmp")
#: a temp file younger than this may belong to a write in progress (another inferctl run): left alone
STALE_AFTER_MIN = 10

# $1 directory, $2 age in minutes, then the name patterns; prints the stale ones, one per line
_STALE = r"""d=$1; age=$2; shift 2
[ -d "$d" ] || exit 0
for pat; do find "$d" -maxdepth 1 -type f -name "$pat" -mmin +"$age" -print; done | sort -u
"""
# $1 path, $2 how many backups to keep: the oldest beyond that are removed (timestamps sort as text)
_PRUNE = r"""p=$1; keep=$2
for f in "$p".inferctl-backup-*; do [ -e "$f" ] && printf '%s\n' "$f"; done | sort |
  awk -v k="$keep" '{a[NR]=$0} END {for (i = 1; i <= NR - k; i++) print a[i]}' |
  while IFS= read -r f; do rm -f -- "$f"; done
"""


def stale_temp_files(conn: Connector, directory: str, name: str = "*") -> list[str]:
    """Temp files of interrupted writes of `name` (any file: `*`) in `directory`, older than
    STALE_AFTER_MIN minutes."""
    patterns = [p.format(name=name) for p in TEMP_PATTERNS]
    result = conn.run(Command("sh", "-c", _STALE, "sh", directory, str(STALE_AFTER_MIN), *patterns), sudo=True, timeout=60)
    return [line for line in result.out.splitlines() if line.strip()] if result.ok else []


def remove_files(conn: Connector, paths: list[str]) -> None:
    if paths:
        run_checked(conn, Command("rm", "-f", "--", *paths), sudo=True, what=f"remove {len(paths)} leftover temp file(s)")


def prune_backups(conn: Connector, path: str, keep: int) -> None:
    run_checked(conn, Command("sh", "-c", _PRUNE, "sh", path, str(keep)), sudo=True, what=f"prune backups of {path}")


def write_file(
    conn: Connector, file: ManagedFile, *, now: Callable[[], datetime], keep_backups: int | None = None
) -> str | None:
    """Back up the current file (if any), then replace it atomically, then remove all but the newest
    `keep_backups` backups. Returns the backup path."""
    parent = file.path.rsplit("/", 1)[0] or "/"
    run_checked(conn, Command("mkdir", "-p", "--", parent), sudo=True, what=f"mkdir {parent}")
    backup = backup_path(file.path, now())
    script = '[ -e "$1" ] || exit 3; exec cp -p -- "$1" "$2"'
    result = conn.run(Command("sh", "-c", script, "sh", file.path, backup), sudo=True, timeout=60)
    if result.exit_code == MISSING:
        backup_made = None
    elif result.ok:
        backup_made = backup
    else:
        raise ProvisionError(f"cannot back up {file.path} on {conn.node_name}: {result.err.strip()}")
    conn.put_file(file.path, file.content, mode=file.mode, owner=f"{file.owner}:{file.group}", sudo=True)
    if backup_made and keep_backups is not None:
        prune_backups(conn, file.path, keep_backups)
    return backup_made


#: The Connector's put_file takes the whole content as bytes (there is no streaming put), so big files
#: (torch wheels run to gigabytes, uploaded to many nodes at once) go up in parts of this size and are
#: joined on the node: at most one part per node is in memory.
UPLOAD_PART_BYTES = 64 * 1024 * 1024

# join the parts into a temp file beside the target, rename it over the target, drop the parts
_JOIN = 'set -eu; out=$1; shift; t="$out.inferctl-join.tmp"; cat -- "$@" > "$t"; mv -f -- "$t" "$out"; rm -f -- "$@"'


def upload_file(
    conn: Connector, local: Path, remote_path: str, *, mode: int = 0o644, sudo: bool, part_bytes: int = UPLOAD_PART_BYTES
) -> None:
    """Upload a local file atomically without reading it whole into memory (see UPLOAD_PART_BYTES)."""
    size = local.stat().st_size
    if size <= part_bytes:
        conn.put_file(remote_path, local.read_bytes(), mode=mode, sudo=sudo)
        return
    directory, _, name = remote_path.rpartition("/")
    parts: list[str] = []
    with local.open("rb") as fh:
        for index, chunk in enumerate(iter(lambda: fh.read(part_bytes), b"")):
            part = f"{directory}/.{name}.inferctl-part{index:05d}"
            conn.put_file(part, chunk, mode=mode, sudo=sudo)
            parts.append(part)
    run_checked(conn, Command("sh", "-c", _JOIN, "sh", remote_path, *parts), sudo=sudo, what=f"join the parts of {remote_path}", timeout=1800)
