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
    SudoPasswordRejectedError,
    SudoPasswordRequiredError,
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: seconds between the remote `timeout`'s TERM and its KILL
KILL_AFTER_S = 3

#: the environment variable that tags every remote command of one run (see ABORT_SCRIPT)
RUN_MARKER_VAR = "INFERCTL_RUN"
_MARKER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")

# Ctrl-C on a node, sent on a fresh channel of the same transport. OpenSSH refuses the SSH "signal"
# request for root logins ("session signalling requires privilege separation"), so the commands are
# found by their run marker instead: `env INFERCTL_RUN=<id>` sits in the argv of the remote
# `timeout` wrapper (and of the login shell or sudo above it), never in any other run's processes.
# $1 is a pgrep pattern that cannot match this script's own argv (see marker_pattern). A process
# group is killed only when its leader carries the marker (timeout makes itself a group leader; sshd
# makes the session's shell/sudo one), otherwise just the process: foreign groups are never hit.
# TERM first (timeout forwards it to the command's group), KILL what is left after $2 tenths of a s.
ABORT_SCRIPT = r"""pat=$1; grace_ds=$2
pids=$(pgrep -f -- "$pat") || exit 0
targets=""
for p in $pids; do
  g=$(ps -o pgid= -p "$p" 2>/dev/null | tr -d ' ')
  t=$p
  for q in $pids; do [ "$q" = "$g" ] && t="-$g"; done
  case " $targets " in *" $t "*) ;; *) targets="$targets $t" ;; esac
done
for t in $targets; do kill -s TERM -- "$t" 2>/dev/null; done
i=0
while [ "$i" -lt "$grace_ds" ]; do
  left=""
  for t in $targets; do
    case $t in -*) pgrep -g "${t#-}" >/dev/null 2>&1 && left="$left $t" ;;
                *) kill -0 "$t" 2>/dev/null && left="$left $t" ;; esac
  done
  [ -n "$left" ] || exit 0
  targets=$left; sleep 0.1; i=$((i+1))
done
for t in $targets; do kill -s KILL -- "$t" 2>/dev/null; done
exit 0
"""

# sudo for a non-root login only: a root login runs the command itself (root needs no sudo, and many
# images have none). Decided on the node by the uid, so a uid-0 login of any name counts as root.
SUDO_N_SCRIPT = r"""[ "$(id -u)" = 0 ] && exec "$@"
exec sudo -n -- "$@"
"""

#: the line SUDO_ASKPASS_SCRIPT prints (on stderr, exit 1) when sudo asked for the password twice
PASSWORD_REJECTED_LINE = "inferctl-sudo: sudo asked for the password again: it was rejected"

# With a password, the first line of stdin is the password. `read` in sh consumes exactly that line
# (shells read pipes byte by byte), the rest of stdin flows on to the command. sudo -A asks the helper
# only when a password is actually needed, so NOPASSWD rules keep working and the password never
# reaches the command's stdin. The helper file holds no secret: it prints an environment variable.
#
# The password is offered ONCE. sudo asks again (up to passwd_tries, 3) when it was wrong, and every
# answer counts toward pam_faillock's lockout (deny=3 by default) -- a failed askpass too, since PAM
# sees a failed conversation. So when asked a second time the helper kills sudo (its parent; sudo's
# real uid is the login user's, so it may) before PAM hears an answer: one run costs at most one failed
# attempt per node. sudo's own "Sorry, try again." is left on stderr; PASSWORD_REJECTED_LINE follows.
SUDO_ASKPASS_SCRIPT = r"""IFS= read -r INFERCTL_SUDO_PW || exit 97
if [ "$(id -u)" = 0 ]; then unset INFERCTL_SUDO_PW; exec "$@"; fi
export INFERCTL_SUDO_PW
d=$(mktemp -d) || exit 97
trap 'rm -rf -- "$d"' EXIT
cat > "$d/askpass" <<'EOF'
#!/bin/sh
d=${0%/*}
if [ -e "$d/given" ]; then : > "$d/rejected"; kill -KILL "$PPID"; exit 1; fi
: > "$d/given"
printf '%s\n' "$INFERCTL_SUDO_PW"
EOF
chmod 700 "$d/askpass"
SUDO_ASKPASS="$d/askpass" sudo -A -- "$@"
rc=$?
if [ -e "$d/rejected" ]; then echo "PASSWORD_REJECTED_LINE" >&2; exit 1; fi
exit $rc
""".replace("PASSWORD_REJECTED_LINE", PASSWORD_REJECTED_LINE)


@dataclass(frozen=True)
class SudoMode:
    """How `sudo=True` is honoured on a node: not at all (the login user is privileged, ssh.sudo
    false), `sudo -n`, or sudo with a password sent over stdin. Either way a root login (uid 0 on the
    node) runs the command itself."""

    enabled: bool = True
    password: str | None = None

    def __repr__(self) -> str:  # never show the password
        return f"SudoMode(enabled={self.enabled}, password={'***' if self.password else None})"


def check_env(env: Mapping[str, str] | None) -> None:
    for key in env or {}:
        if not _ENV_NAME.match(key):
            raise UsageError(f"invalid environment variable name {key!r}", remedy="use letters, digits and _")


def check_marker(marker: str) -> None:
    if not _MARKER.match(marker):
        raise ValueError(f"run marker {marker!r} must be letters, digits, '-' and '_'")


def marker_pattern(marker: str) -> str:
    """A pgrep -f pattern for the processes tagged with `marker`, which does not match itself: the
    bracketed first character matches the marker but not the pattern's own text in an argv, and the
    end anchor keeps run `ab-1` from matching run `ab-12`."""
    check_marker(marker)
    return f"{RUN_MARKER_VAR}=[{marker[0]}]{marker[1:]}( |$)"


def build_argv(
    command: Command,
    *,
    sudo: bool,
    sudo_mode: SudoMode,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    marker: str | None = None,
) -> tuple[list[str], bytes]:
    """The argv to run and the bytes to put in front of stdin (the sudo password line, if any).

    Order: sudo -> timeout -> env -> command, so the timeout and env apply as the target user and a
    remote `timeout` can kill a root process group. `marker` tags the command line with
    INFERCTL_RUN=<marker> (also visible to the command) so ABORT_SCRIPT can find it.
    """
    check_env(env)
    argv = list(command.argv)
    assignments = [f"{k}={v}" for k, v in (env or {}).items()]
    if marker is not None:
        check_marker(marker)
        assignments.insert(0, f"{RUN_MARKER_VAR}={marker}")
    if assignments:
        argv = ["env", *assignments, *argv]
    if timeout is not None:
        # GNU timeout runs the command in its own process group and kills the whole group, and
        # forwards TERM/INT/HUP it receives to that group (used to cancel on Ctrl-C).
        argv = ["timeout", "-k", str(KILL_AFTER_S), f"{max(timeout, 0.001):g}", *argv]
    prefix = b""
    if sudo and sudo_mode.enabled:
        if sudo_mode.password is None:
            argv = sudo_n_argv(argv)
        else:
            argv = ["sh", "-c", SUDO_ASKPASS_SCRIPT, "inferctl-sudo", *argv]
            prefix = sudo_mode.password.encode() + b"\n"
    return argv, prefix


def sudo_n_argv(argv: list[str]) -> list[str]:
    """`argv` through `sudo -n` for a non-root login, as itself for root (SUDO_N_SCRIPT)."""
    return ["sh", "-c", SUDO_N_SCRIPT, "inferctl-sudo", *argv]


def is_remote_timeout(result_exit: int | None, duration: float, timeout: float | None) -> bool:
    """`timeout` exits 124 (TERM worked) or 137 (needed KILL) when the limit hit."""
    return timeout is not None and result_exit in (124, 137) and duration >= timeout * 0.95


# sudo 1.9 prints some refusals WITHOUT its "sudo: " prefix ("Sorry, try again.", "alice is not in the
# sudoers file."); each pattern must match a whole stderr line, so a command's own output is not taken
# for sudo's. Messages as printed by sudo 1.9.13 (Debian 12); their source: plugins/sudoers/ in
# https://github.com/sudo-project/sudo (check.c, logging.c, auth/sudo_auth.c).
_REJECTED = re.compile(
    rf"^(Sorry, try again\.|sudo: \d+ incorrect password attempts?|{re.escape(PASSWORD_REJECTED_LINE)})$"
)
_NOT_ALLOWED = re.compile(
    r"^(sudo: )?(\S+ is not in the sudoers file\b.*|Sorry, user \S+ (is not allowed to execute|may not run sudo)\b.*)$"
)
_NEEDS_PASSWORD = re.compile(
    r"^sudo: (a password is required|a terminal is required|no password was provided|no askpass program)"
)
# sudo warnings that do not stop the command: the command's own exit 1 must stay a result
_HARMLESS = re.compile(r"^sudo: (unable to resolve host|setrlimit)")


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
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    if result.exit_code != 1 or not lines:
        return
    if any(_REJECTED.match(line) for line in lines):
        raise SudoPasswordRejectedError(
            f"{node}: sudo rejected the password (from the variable named by ssh.sudo_password_env); it was "
            "offered once, and sudo was stopped when it asked again",
            remedy="check the password in that environment variable; each run costs at most one failed "
            "attempt toward the account's lockout (pam_faillock): `faillock --user USER` on the node lists them",
        )
    refused = next((line for line in lines if _NOT_ALLOWED.match(line)), None)
    if refused is not None:
        raise SudoNotAllowedError(
            f"{node}: the SSH user may not use sudo: {refused.removeprefix('sudo: ')}",
            remedy="add a sudoers rule for the SSH user on the node",
        )
    if any(_NEEDS_PASSWORD.match(line) for line in lines):
        raise SudoPasswordRequiredError(
            f"{node}: sudo needs a password",
            remedy="allow passwordless sudo (NOPASSWD) for the SSH user, or set ssh.sudo_password_env to "
            "the name of an environment variable holding the password",
        )
    first = next((line for line in lines if not _HARMLESS.match(line)), "")
    if sudo_mode.enabled and first.startswith("sudo:"):
        raise SudoError(
            f"{node}: sudo failed: {first}",
            remedy="run the command by hand on the node with `sudo -n` to see why",
        )
