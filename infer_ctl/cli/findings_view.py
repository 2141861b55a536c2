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
    if "run_counts" in report.data:  # audit --since-last
        _since_last_summary(console, report)
    else:
        render_summary(console, report)
    if quiet and not show_all:
        console.print(f"[dim]{quiet} ok/skipped findings not listed; --all lists them[/dim]")


def _since_last_summary(console: Console, report: Report) -> None:
    """`audit --since-last` lists the changes, but its status and exit code are the whole run's: say both,
    so "FAIL" next to an empty list reads as "still failing, nothing new" (not "no findings")."""
    from rich.text import Text

    from infer_ctl.output.table import status_text

    changed = len(report.findings)
    since = report.data.get("since")
    head = f"{changed} change{'s' if changed != 1 else ''}" if changed else "no changes"
    head += f" since {since}" if since else " (no earlier run in --history)"
    run = ", ".join(f"{n} {s}" for s, n in report.data["run_counts"].items()) or "no findings"
    console.print(Text.assemble(
        ("overall: ", "bold"), status_text(report.status),
        f"  ({head}; this run: {run}; exit {int(report.exit_code)}; {report.duration_s:.2f}s)",
    ))  # fmt: skip
