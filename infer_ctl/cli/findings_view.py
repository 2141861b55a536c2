"""Problem-first tables for `check gpu` and `audit`: one 8-GPU node has ~120 findings, nearly all OK,
so the table lists only what needs attention (plus the summary line) unless `--all` is given. The JSON
document always holds every finding."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from infer_ctl.core.report import Report

AllOpt = Annotated[
    bool, typer.Option("--all", help="Also list OK and skipped findings in the table (--json always has all).")
]


def render_problems(console: Console, report: Report, *, show_all: bool = False) -> None:
    from infer_ctl.core.findings import Status
    from infer_ctl.output.table import findings_table, render_summary

    quiet = sum(1 for f in report.findings if f.status in (Status.OK, Status.SKIP))
    if report.findings and (show_all or quiet < len(report.findings)):
        console.print(findings_table(report.findings, title=report.command, show_ok=show_all))
    render_summary(console, report)
    if quiet and not show_all:
        console.print(f"[dim]{quiet} ok/skipped findings not listed; --all lists them[/dim]")
