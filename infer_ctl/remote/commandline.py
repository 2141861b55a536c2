"""Turning a Command into what actually runs on a node: env, sudo and the remote-side timeout.

Everything is argv-based and quoted once with shlex (Command.shell()); values never get pasted into
a shell string. Passwords never appear in argv: see SUDO_ASKPASS_SCRIPT.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from infer_ctl.errors import UsageError
from infer_ctl.remote.base import Command, CommandResult
from infer_ctl.remote.errors import (
    SudoError,
    SudoMissingError,
    SudoNotAllowedError,
    SudoPasswordRequiredError,
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: seconds between the remote `timeout`'s TERM and its KILL
KILL_AFTER_S = 3

# With a password, the first line of stdin is the password. `read` in sh consumes exactly that line
# (shells read pipes byte by byte), the rest of stdin flows on to the command. sudo -A asks the helper
# only when a password is actually needed, so NOPASSWD rules keep working and the password never
# reaches the command's stdin. The helper file holds no secret: it prints an environment variable.
SUDO_ASKPASS_SCRIPT = r"""IFS= read -r INFERCTL_SUDO_PW || exit 97
export INFERCTL_SUDO_PW
a=$(mktemp) || exit 97
trap 'rm -f "$a"' EXIT
printf '%s\n' '#!/bin/sh' 'printf "%s\n" "$INFERCTL_SUDO_PW"' > "$a"
chmod 700 "$a"
SUDO_ASKPASS="$a" sudo -A -- "$@"
"""


@dataclass(frozen=True)
class SudoMode:
    """How `sudo=True` is honoured on a node: not at all (the login user is privileged, ssh.sudo
    false), `sudo -n`, or sudo with a password sent over stdin."""

    enabled: bool = True
    password: str | None = None

    def __repr__(self) -> str:  # never show the password
        return f"SudoMode(enabled={self.enabled}, password={'***' if self.password else None})"


def check_env(env: Mapping[str, str] | None) -> None:
    for key in env or {}:
        if not _ENV_NAME.match(key):
            raise UsageError(f"invalid environment variable name {key!r}", remedy="use letters, digits and _")


def build_argv(
    command: Command,
    *,
    sudo: bool,
    sudo_mode: SudoMode,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> tuple[list[str], bytes]:
    """The argv to run and the bytes to put in front of stdin (the sudo password line, if any).

    Order: sudo -> timeout -> env -> command, so the timeout and env apply as the target user and a
    remote `timeout` can kill a root process group.
    """
    check_env(env)
    argv = list(command.argv)
    if env:
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), *argv]
    if timeout is not None:
        # GNU timeout runs the command in its own process group and kills the whole group, and
        # forwards TERM/INT/HUP it receives to that group (used to cancel on Ctrl-C).
        argv = ["timeout", "-k", str(KILL_AFTER_S), f"{max(timeout, 0.001):g}", *argv]
    prefix = b""
    if sudo and sudo_mode.enabled:
        if sudo_mode.password is None:
            argv = ["sudo", "-n", "--", *argv]
        else:
            argv = ["sh", "-c", SUDO_ASKPASS_SCRIPT, "inferctl-sudo", *argv]
            prefix = sudo_mode.password.encode() + b"\n"
    return argv, prefix


def is_remote_timeout(result_exit: int | None, duration: float, timeout: float | None) -> bool:
    """`timeout` exits 124 (TERM worked) or 137 (needed KILL) when the limit hit."""
    return timeout is not None and result_exit in (124, 137) and duration >= timeout * 0.95


def raise_for_sudo(node: str, result: CommandResult, sudo_mode: SudoMode) -> None:
    """sudo's own refusals are errors (the command never ran), not results of the command."""
    if result.exit_code not in (1, 127) or result.timed_out:
        return
    err = result.err
    if result.exit_code == 127 and "sudo" in err and ("not found" in err or "No such file" in err):
        raise SudoMissingError(
            f"{node}: sudo is not installed",
            remedy="install sudo on the node, or log in as a privileged user and set ssh.sudo: false",
        )
    if result.exit_code != 1 or not err.lstrip().startswith("sudo:"):
        return
    if "password is required" in err or "terminal is required" in err or "no password was provided" in err:
        raise SudoPasswordRequiredError(
            f"{node}: sudo needs a password",
            remedy="allow passwordless sudo (NOPASSWD) for the SSH user, or set ssh.sudo_password_env to "
            "the name of an environment variable holding the password",
        )
    if "incorrect password" in err:
        raise SudoPasswordRequiredError(
            f"{node}: sudo rejected the password (from the variable named by ssh.sudo_password_env)",
            remedy="check the password in that environment variable",
        )
    if "not in the sudoers" in err or "not allowed to" in err or "may not run sudo" in err:
        raise SudoNotAllowedError(
            f"{node}: the SSH user may not use sudo: {err.strip().splitlines()[0]}",
            remedy="add a sudoers rule for the SSH user on the node",
        )
    if sudo_mode.enabled:
        raise SudoError(
            f"{node}: sudo failed: {err.strip().splitlines()[0]}",
            remedy="run the command by hand on the node with `sudo -n` to see why",
        )
