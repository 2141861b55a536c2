"""ssh_config's `Include`, which paramiko's SSHConfig does not implement (it keeps `include` as an
ordinary option and reads nothing): expanded here into one text that paramiko then parses.

Without this, a HostName, User, Port, ProxyJump or UserKnownHostsFile kept in an included file
(`Include config.d/*` is the usual layout) is silently ignored, and a host whose key sits in such a
UserKnownHostsFile looks unknown, so --accept-new-host-keys would trust whatever key it offers.

Semantics as ssh_config(5) (OpenSSH 9.x, readconf.c `oInclude`): every argument is a glob(7) pattern
with `~`, a relative one is under ~/.ssh, matches are read in lexical order, nesting is limited to 16
levels. An Include inside a Host/Match block is conditional: the included lines apply only where the
block applies (its Host/Match lines are combined with the enclosing condition as one `Match`), and the
enclosing block resumes after the included text.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from pathlib import Path

from infer_ctl.errors import ProfileError

#: readconf.c READCONF_MAX_DEPTH
MAX_DEPTH = 16

_KEYWORD = re.compile(r"^\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$")


def read_with_includes(path: Path, *, depth: int = 0) -> str:
    """The text of ssh_config file `path` with every `Include` replaced by what it includes."""
    if depth > MAX_DEPTH:
        raise ProfileError(
            f"SSH config {path}: Include nested more than {MAX_DEPTH} levels (a loop?)",
            remedy="check the Include lines of your ssh_config files",
        )
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ProfileError(
            f"cannot read SSH config {path}: {exc.strerror}",
            remedy="make it readable, or remove the Include that names it",
        ) from None
    out: list[str] = []
    condition: list[str] | None = None  # the enclosing Host/Match block as Match criteria; None: top level
    header: str | None = None
    for line in text.splitlines():
        m = _KEYWORD.match(line)
        keyword = m.group(1).lower() if m else ""
        if keyword in ("host", "match"):
            header, condition = line, _as_criteria(keyword, m.group(2) if m else "")
            out.append(line)
            continue
        if keyword != "include" or m is None:
            out.append(line)
            continue
        for included in _included_files(_words(m.group(2))):
            body = read_with_includes(included, depth=depth + 1)
            out.extend(_under(body, condition))
            # the included file may have opened blocks of its own: the enclosing one resumes
            out.append(header if header is not None else "Host *")
    return "\n".join(out) + "\n"


def _included_files(patterns: list[str]) -> list[Path]:
    files: list[Path] = []
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if not os.path.isabs(pattern):
            pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
        files.extend(Path(p) for p in sorted(glob.glob(pattern)) if not os.path.isdir(p))
    return files


def _under(body: str, condition: list[str] | None) -> list[str]:
    """`body`'s lines, its Host/Match lines combined with the enclosing `condition` (AND)."""
    if not condition:
        return body.splitlines()
    lines = []
    for line in body.splitlines():
        m = _KEYWORD.match(line)
        keyword = m.group(1).lower() if m else ""
        if m is not None and keyword in ("host", "match"):
            inner = _as_criteria(keyword, m.group(2))
            line = "Match " + " ".join(condition + inner)
        lines.append(line)
    return lines


def _as_criteria(keyword: str, value: str) -> list[str]:
    """A Host or Match line's condition as Match criteria (`Host a !b` -> `originalhost a,!b`: Host
    matches the name as given, which is Match's originalhost; a Match line's own text is kept as
    written, quotes included). `all` is dropped: it adds nothing to an AND and paramiko refuses it
    next to other criteria."""
    if keyword == "host":
        words = _words(value)
        return ["originalhost " + ",".join(words)] if words and words != ["*"] else []
    return [] if value.split("#", 1)[0].strip().lower() == "all" else [value]


def _words(value: str) -> list[str]:
    try:
        return shlex.split(value, comments=True)
    except ValueError:
        return value.split()
