"""The links to the pinned SGLang venv on a node: probe, switch and roll back (building the venv is the
venv step, steps/venv.py).

`<venvs>/sglang-<version>-<lockhash>` is built once and never modified; `<venvs>/current` (and the
`<venvs>/<version>` alias the launch units use) point at it. Switching replaces each symlink with one
rename, so a reader sees the old or the new target, never a missing link. `<venvs>/previous` remembers
the last target for `inferctl provision rollback`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infer_ctl.core.provision.lock import MARKER_NAME
from infer_ctl.provision.errors import ProvisionError
from infer_ctl.provision.remote_files import run_checked
from infer_ctl.remote.base import Command, Connector

_PROBE = r"""
V=$1; D=$2
printf 'current=%s\n' "$(readlink -- "$V/current" 2>/dev/null)"
printf 'previous=%s\n' "$(readlink -- "$V/previous" 2>/dev/null)"
printf 'alias=%s\n' "$(readlink -- "$V/$3" 2>/dev/null)"
if [ -d "$D" ]; then echo exists=yes; else echo exists=no; fi
printf 'marker=%s\n' "$(cat -- "$D/""" + MARKER_NAME + r"""" 2>/dev/null)"
"""

# Replace a symlink atomically: build it under a temp name, then rename(2) over the old one.
_SWITCH = r"""
V=$1; D=$2; ALIAS=$3
old=$(readlink -- "$V/current" 2>/dev/null || true)
ln -sfn -- "$D" "$V/.current.new" && mv -Tf -- "$V/.current.new" "$V/current" || exit 1
if [ -n "$ALIAS" ]; then ln -sfn -- "$D" "$V/.alias.new" && mv -Tf -- "$V/.alias.new" "$V/$ALIAS" || exit 1; fi
if [ -n "$old" ] && [ "$old" != "$D" ]; then
  ln -sfn -- "$old" "$V/.previous.new" && mv -Tf -- "$V/.previous.new" "$V/previous" || exit 1
fi
"""


@dataclass(frozen=True)
class VenvState:
    current: str | None
    previous: str | None
    alias: str | None
    exists: bool
    marker: str | None


def probe_venv(conn: Connector, venvs: str, target: str, alias: str) -> VenvState:
    result = conn.run(Command("sh", "-c", _PROBE, "sh", venvs, target, alias), timeout=60)
    if not result.ok:
        raise ProvisionError(f"cannot inspect {venvs} on {conn.node_name}: {result.err.strip()}")
    values = dict(line.split("=", 1) for line in result.out.splitlines() if "=" in line)
    return VenvState(
        current=values.get("current") or None,
        previous=values.get("previous") or None,
        alias=values.get("alias") or None,
        exists=values.get("exists") == "yes",
        marker=values.get("marker") or None,
    )


def installed_version(conn: Connector, target: str, package: str = "sglang") -> str | None:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    result = conn.run(Command(f"{target}/bin/python", "-c", code), timeout=120)
    return result.out.strip() if result.ok else None


def switch_current(conn: Connector, venvs: str, target: str, alias: str = "") -> None:
    run_checked(
        conn,
        Command("sh", "-c", _SWITCH, "sh", venvs, target, alias),
        sudo=True,
        what=f"switch {venvs}/current to {target}",
    )


def rollback(conn: Connector, venvs: str) -> tuple[str, str]:
    """Point `current` back at `previous` (which becomes the new `previous`). Returns (from, to)."""
    state = probe_venv(conn, venvs, "/nonexistent", "")
    if not state.previous:
        raise ProvisionError(
            f"{conn.node_name}: no previous venv recorded in {venvs}/previous; nothing to roll back to",
            remedy="set sglang.version back in the profile and run `inferctl provision --apply`",
        )
    marker = conn.run(Command("test", "-f", f"{state.previous}/{MARKER_NAME}"), timeout=30)
    if not marker.ok:
        raise ProvisionError(
            f"{conn.node_name}: previous venv {state.previous} is incomplete or gone; refusing to switch to it",
            remedy="reinstall it with `inferctl provision --apply` using the old profile version",
        )
    # Units run `<venvs>/<version>/bin/python`: point that version's link back too, so a rollback to a
    # venv of the same version (another lock) reaches the servers at their next restart.
    alias = previous_version(state.previous)
    switch_current(conn, venvs, state.previous, alias or "")
    return state.current or "", state.previous


def previous_version(target: str) -> str | None:
    """`.../sglang-0.5.23-0123456789ab` -> `0.5.23` (None for a name provisioning did not make)."""
    match = re.fullmatch(r"sglang-(.+)-[0-9a-f]{12}", target.rstrip("/").rsplit("/", 1)[-1])
    return match.group(1) if match else None
