"""The whole `inferctl` command tree as click sees it, for tests that must cover every command (option
clashes, `-p` vs `$INFERCTL_PROFILE`, examples in `--help`): built from the lazy registry with every verb
loaded, so a new command is covered without editing a list."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from infer_ctl.cli.main import build_app, click_command


def root() -> Any:
    return click_command(build_app([]))


def commands() -> Iterator[tuple[str, Any]]:
    """(path, click command) of every leaf command, e.g. ("router status", <command>)."""

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in sorted(subs.items()):
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    yield from walk(root(), [])


def groups() -> Iterator[tuple[str, Any]]:
    """(path, click group) of the root and every command group."""

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
        subs = getattr(cmd, "commands", None)
        if subs:
            yield " ".join(path), cmd
            for name, sub in sorted(subs.items()):
                yield from walk(sub, [*path, name])

    yield from walk(root(), [])


def options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "option"]
