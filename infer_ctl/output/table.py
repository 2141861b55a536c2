"""Rich tables for findings and per-node results."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.report import Report

STATUS_STYLE = {
    Status.OK: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.UNKNOWN: "magenta",
    Status.SKIP: "dim",
}


def status_text(status: Status) -> Text:
    return Text(status.value.upper(), style=STATUS_STYLE[status])


def findings_table(findings: Sequence[Finding], *, title: str | None = None, show_ok: bool = True) -> Table:
    table = Table(title=title, show_lines=False, header_style="bold")
    for col in ("status", "check", "node", "subject", "message"):
        table.add_column(col, overflow="fold")
    for f in findings:
        if not show_ok and f.status in (Status.OK, Status.SKIP):
            continue
        message = (
            f.message
            if not f.remedy or f.status in (Status.OK, Status.SKIP)
            else f"{f.message}\n→ {f.remedy}"
        )
        table.add_row(status_text(f.status), f.check, f.node, f.subject, message)
    return table


def render_summary(console: Console, report: Report) -> None:
    counts = {s: sum(1 for f in report.findings if f.status is s) for s in Status}
    parts = [f"{counts[s]} {s.value}" for s in Status if counts[s]]
    console.print(
        Text.assemble(
            ("overall: ", "bold"),
            status_text(report.status),
            f"  ({', '.join(parts) or 'no findings'}; exit {int(report.exit_code)}; {report.duration_s:.2f}s)",
        )
    )


def render_findings_report(console: Console, report: Report, *, show_ok: bool = True) -> None:
    if report.findings:
        console.print(findings_table(report.findings, title=report.command, show_ok=show_ok))
    render_summary(console, report)
