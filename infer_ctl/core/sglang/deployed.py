"""What is deployed on a node against what the profile renders and what runs: pure judgement.

Three layers can disagree. The profile (what `launch` would write now), the files on the node (env
file, unit or run script, as the last `launch` or `provision` wrote them), and the running process
(its command line and environment, read from /proc). Files differing from the profile: `launch`
would rewrite them and restart (`servers.files`). The process differing from the files: they were
changed after it started (a `provision` without `--restart`, a hand edit), so it still runs the old
settings until restarted (`servers.restart_pending`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.argv import server_args
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.core.sglang.settings import canonical_value, command_settings, dest


@dataclass(frozen=True)
class RunningServer:
    pid: int
    argv: list[str]
    #: its environment; None when /proc/PID/environ could not be read (another user, no sudo)
    environ: Mapping[str, str] | None = None


def parse_env_file(text: str) -> dict[str, str]:
    """`NAME=value` lines as envfile.quote_env_value writes them (bare, or single-quoted)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        if len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]
        out[name.strip()] = value
    return out


def systemd_unquote(line: str) -> list[str]:
    """The words of an ExecStart= value as launch/render.py's systemd_quote writes them: bare words, or
    double-quoted with `\\` and `"` escaped; `$$` and `%%` stand for `$` and `%`."""
    words: list[str] = []
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        if i >= n:
            break
        word: list[str] = []
        if line[i] == '"':
            i += 1
            while i < n and line[i] != '"':
                if line[i] == "\\" and i + 1 < n:
                    i += 1
                word.append(line[i])
                i += 1
            i += 1
        else:
            while i < n and line[i] != " ":
                word.append(line[i])
                i += 1
        words.append("".join(word).replace("$$", "$").replace("%%", "%"))
    return words


def deployed_argv(text: str | None) -> list[str] | None:
    """The command line a deployed unit (ExecStart=) or run script (`exec ...`) starts."""
    for line in (text or "").splitlines():
        if line.startswith("ExecStart="):
            return systemd_unquote(line[len("ExecStart=") :])
        if line.startswith("exec "):
            return shlex.split(line[len("exec ") :])
    return None


def _first_difference(old: str, new: str) -> str:
    a, b = old.splitlines(), new.splitlines()
    for i in range(max(len(a), len(b))):
        left = a[i] if i < len(a) else "<end of file>"
        right = b[i] if i < len(b) else "<end of file>"
        if left != right:
            return f"line {i + 1}: {left!r} on the node, {right!r} from the profile"
    return "they differ in line endings"


def judge_files(
    instance: Instance, rendered: Sequence[tuple[str, str]], deployed: Mapping[str, str | None]
) -> list[Finding]:
    """The node's env file and unit/run script against what the profile renders now."""
    out: list[Finding] = []
    for path, text in rendered:
        have = deployed.get(path)
        if have == text:
            continue
        what = "missing on the node" if have is None else f"differs ({_first_difference(have, text)})"
        out.append(
            Finding.warn(
                "servers.files",
                instance.node,
                instance.name,
                f"{path} {what}: the profile changed since the last launch",
                details={"path": path, "deployed": have is not None},
                remedy=f"`inferctl launch --nodes {instance.node}` writes it and restarts {instance.name} "
                "(`launch --rolling` to keep the others serving)",
            )
        )
    if not out:
        out.append(Finding.ok("servers.files", instance.node, instance.name, "deployed files match the profile"))
    return out


def judge_restart_pending(
    instance: Instance,
    env_path: str,
    env_text: str | None,
    command_path: str,
    command_text: str | None,
    running: RunningServer,
) -> list[Finding]:
    """The running process against the files on the node: differences mean the files changed after it
    started, and it runs the old settings until it is restarted."""
    reasons: list[str] = []
    want_argv = deployed_argv(command_text)
    if want_argv is not None:
        want = command_settings(server_args(want_argv))
        got = command_settings(server_args(running.argv))
        for flag in [*want, *(f for f in got if f not in want)]:
            key = dest(flag)
            if canonical_value(key, want.get(flag)) != canonical_value(key, got.get(flag)):
                reasons.append(f"{command_path} gives {flag} {want.get(flag, '(unset)')}, the server runs with "
                               f"{got.get(flag, '(unset)')}")  # fmt: skip
    env_note = ""
    if running.environ is None:
        env_note = f" (environment not compared: /proc/{running.pid}/environ is not readable; enable ssh.sudo)"
    elif env_text is not None:
        for name, value in parse_env_file(env_text).items():
            have = running.environ.get(name)
            if have != value:
                reasons.append(f"{env_path} sets {name}={value}, the server runs with "
                               f"{name}={'(unset)' if have is None else have}")  # fmt: skip
    if not reasons:
        return [
            Finding.ok(
                "servers.restart_pending",
                instance.node,
                instance.name,
                f"pid {running.pid} runs what is deployed{env_note}",
            )
        ]
    return [
        Finding.warn(
            "servers.restart_pending",
            instance.node,
            instance.name,
            f"restart pending: pid {running.pid} started before its files changed: {reasons[0]}"
            + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""),
            details={"pid": running.pid, "differences": reasons},
            remedy=f"restart it when convenient: `inferctl launch --rolling --nodes {instance.node}` "
            "(or `inferctl provision --apply --restart`)",
        )
    ]
