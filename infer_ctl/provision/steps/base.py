"""The step protocol and the managed-file helper most steps are built on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from infer_ctl.core.provision.desired import ManagedFile
from infer_ctl.core.provision.diff import file_diff
from infer_ctl.core.provision.model import EntryKind
from infer_ctl.provision.context import Planned, StepContext
from infer_ctl.provision.remote_files import (
    expected_stat,
    read_file_and_stat,
    remove_files,
    run_checked,
    stale_temp_files,
    write_file,
)
from infer_ctl.remote.base import Command


class Step(Protocol):
    name: str
    #: one line for `inferctl provision steps` and the runbook
    title: str
    #: root is needed to apply (and to read what it manages)
    needs_sudo: bool

    def plan(self, ctx: StepContext) -> list[Planned]: ...


def plan_file(
    ctx: StepContext,
    step: str,
    file: ManagedFile,
    *,
    after_write: Sequence[Command] = (),
    then: Callable[[], None] | None = None,
) -> Planned:
    """OK when content, mode and owner match; else CHANGE with a unified diff. The action writes the file
    atomically with a backup, then runs `after_write` (daemon-reload, sysctl -p, ...)."""
    current, have_stat = read_file_and_stat(ctx.conn, file.path, sudo=True)
    want_stat = expected_stat(file)
    directory, _, name = file.path.rpartition("/")
    leftovers = stale_temp_files(ctx.conn, directory or "/", name)
    keep = ctx.options.keep_backups
    commands = (f"write {file.path} (mode {file.mode:o}, {file.owner}:{file.group}; the last {keep} backups kept)",
                *tuple(c.shell() for c in after_write))  # fmt: skip
    if current == file.content and have_stat == want_stat:
        if not leftovers:
            return Planned(ctx.entry(step, file.path, EntryKind.OK, "up to date"))
        # an interrupted write left its temp file beside an up-to-date file: only the cleanup is planned
        entry = ctx.entry(step, file.path, EntryKind.CHANGE, _leftover_summary(leftovers),
                          commands=(f"rm -f -- {' '.join(leftovers)}",), needs_sudo=True)  # fmt: skip
        return Planned(entry, lambda: remove_files(ctx.conn, leftovers))

    def action() -> None:
        write_file(ctx.conn, file, now=ctx.options.now, keep_backups=keep)
        remove_files(ctx.conn, leftovers)
        for command in after_write:
            run_checked(ctx.conn, command, sudo=True, what=command.shell())
        if then is not None:
            then()

    if current is None:
        summary = "create"
    elif current != file.content:
        summary = "update (content differs)"
    else:
        summary = f"fix mode/owner {have_stat} -> {want_stat}"
    if leftovers:
        summary += f"; {_leftover_summary(leftovers)}"
    entry = ctx.entry(
        step,
        file.path,
        EntryKind.CHANGE,
        summary,
        diff=file_diff(file.path, current, file.content) if current != file.content else "",
        before=have_stat if have_stat != want_stat else None,
        after=want_stat if have_stat != want_stat else None,
        commands=commands,
        needs_sudo=True,
    )
    return Planned(entry, action)


def _leftover_summary(paths: list[str]) -> str:
    names = ", ".join(p.rsplit("/", 1)[-1] for p in paths)
    return f"remove {len(paths)} leftover temp file(s) of an interrupted write: {names}"


def systemctl(*args: str) -> Command:
    return Command("systemctl", *args)
