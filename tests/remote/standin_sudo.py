"""A STAND-IN for sudo 1.9 (it is not sudo) to drop on a harness node's PATH, for the password paths
that real sudo covers only with a configured account (tests/remote/test_sudo_real.py does that where
it can). What it imitates, as sudo 1.9.13 behaves (checked against Debian 12's sudo):

- options -n, -A (askpass: runs $SUDO_ASKPASS PROMPT as its own child, reads one line), -S (prompt on
  stderr, password line from stdin), -p PROMPT, -k, `--`;
- a wrong password is asked again up to `tries` times, with "Sorry, try again." (no "sudo:" prefix)
  between attempts, then "sudo: N incorrect password attempts", exit 1;
- an askpass that fails: "sudo: no password was provided", exit 1;
- -n when a password is needed: "sudo: a password is required", exit 1;
- `sudoers="none"`: after a correct password, "USER is not in the sudoers file." (no prefix), exit 1;
  `"nopasswd"`: runs without asking;
- runs the command with SUDO_USER/SUDO_UID set (the harness's tests run as root, so it is root).

Every password it receives is counted in `sudo.attempts` beside it (one line per attempt, "ok" or
"wrong"), and every command it runs is logged in `sudo.log`.
"""

from __future__ import annotations

import shlex


def standin_sudo(password: str = "s3cret pw", *, sudoers: str = "all", tries: int = 3) -> str:
    if sudoers not in ("all", "nopasswd", "none"):
        raise ValueError("sudoers: all, nopasswd or none")
    return f"""#!/bin/sh
# STAND-IN for sudo 1.9 (not sudo): tests/remote/standin_sudo.py
here=$(dirname "$0")
expected={shlex.quote(password)}
policy={sudoers}
tries={int(tries)}
noninteractive=; askpass=; use_stdin=; prompt="[sudo] password for $(id -un): "
while [ $# -gt 0 ]; do
  case $1 in
    -n) noninteractive=1 ;;
    -A) askpass=1 ;;
    -S) use_stdin=1 ;;
    -k) ;;
    -p) shift; prompt=$1 ;;
    --) shift; break ;;
    -*) echo "sudo: stand-in: unsupported option $1" >&2; exit 1 ;;
    *) break ;;
  esac
  shift
done
user=$(id -un)
if [ "$policy" != nopasswd ]; then
  if [ -n "$noninteractive" ]; then echo "sudo: a password is required" >&2; exit 1; fi
  if [ -z "$askpass$use_stdin" ]; then
    echo "sudo: a terminal is required to read the password; either use the -S option to read from standard input or configure an askpass helper" >&2
    exit 1
  fi
  i=0; ok=
  while [ "$i" -lt "$tries" ]; do
    [ "$i" -gt 0 ] && echo "Sorry, try again." >&2
    i=$((i + 1))
    if [ -n "$askpass" ]; then
      if [ -z "$SUDO_ASKPASS" ]; then echo "sudo: no askpass program specified, try setting SUDO_ASKPASS" >&2; exit 1; fi
      answer=$(mktemp)
      # a direct child, as sudo runs its askpass: the helper's $PPID is this process
      if ! "$SUDO_ASKPASS" "$prompt" > "$answer"; then
        rm -f "$answer"; echo "sudo: no password was provided" >&2
        echo "sudo: $((i - 1)) incorrect password attempt" >&2; exit 1
      fi
      IFS= read -r pw < "$answer"; rm -f "$answer"
    else
      printf '%s' "$prompt" >&2
      if ! IFS= read -r pw; then echo >&2; echo "sudo: no password was provided" >&2; exit 1; fi
    fi
    if [ "$pw" = "$expected" ]; then echo ok >> "$here/sudo.attempts"; ok=1; break; fi
    echo wrong >> "$here/sudo.attempts"
  done
  if [ -z "$ok" ]; then echo "sudo: $tries incorrect password attempts" >&2; exit 1; fi
fi
if [ "$policy" = none ]; then echo "$user is not in the sudoers file." >&2; exit 1; fi
SUDO_USER=$user SUDO_UID=$(id -u); export SUDO_USER SUDO_UID
echo "$*" >> "$here/sudo.log"
exec "$@"
"""
