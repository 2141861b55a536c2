"""Rich tables for findings and per-node results. Every cell of text that may come from a node goes
through output.terminal_text.safe_cell (no control sequences, no rich markup)."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.report import Report
from infer_ctl.output.terminal_text import safe_cell

STATUS_STYLE = {
    Status.OK: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.UNKNOWN: "magenta",
    Status.SKIP: "dim",
}


def status_text(status: Status) -> Text:
    return Text(status.value.upper(), style=STATUS_STYLE[status])


class FindingsView:
    """Findings rendered for the width at hand: a table on wide terminals, and on narrow ones (or an
    80-column pipe) one block per finding — `STATUS check node subject`, then the message and the
    remedy indented — so messages are never squeezed into slivers."""

    WIDE = 110

    def __init__(self, findings: Sequence[Finding], title: str | None, show_ok: bool) -> None:
        self.findings = [f for f in findings if show_ok or f.status not in (Status.OK, Status.SKIP)]
        self.title = title

    def _message(self, f: Finding) -> str:
        if f.remedy and f.status not in (Status.OK, Status.SKIP):
            return f"{f.message}\n→ {f.remedy}"
        return f.message

    def _table(self) -> Table:
        table = Table(title=self.title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("status", no_wrap=True)
        table.add_column("check", no_wrap=True)
        table.add_column("node", no_wrap=True)
        table.add_column("subject", overflow="fold", max_width=24)
        table.add_column("message", overflow="fold", ratio=1)
        for f in self.findings:
            table.add_row(
                status_text(f.status),
                safe_cell(f.check, multiline=False),
                safe_cell(f.node, multiline=False),
                safe_cell(f.subject, multiline=False),
                safe_cell(self._message(f)),
            )
        return table

    def _blocks(self, piped: bool) -> list[Text | Padding]:
        out: list[Text | Padding] = []
        if self.title:
            out.append(Text(self.title, style="bold"))
        for f in self.findings:
            out.append(
                Text.assemble(
                    status_text(f.status),
                    " ",
                    safe_cell(f.check, multiline=False, style="bold"),
                    "  ",
                    safe_cell(f"{f.node}  {f.subject}", multiline=False),
                )
            )
            if piped:  # one line per message line, never wrapped at a pretend width, no trailing blanks
                out += [Text("      ").append_text(line) for line in safe_cell(self._message(f)).split("\n")]
            else:
                out.append(Padding(safe_cell(self._message(f)), (0, 0, 0, 6)))
        for line in out:
            if piped and isinstance(line, Text):
                line.no_wrap, line.overflow = True, "ignore"
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # piped: always the blocks (the table's box and folded cells are no use to grep)
        if console.is_terminal and options.max_width >= self.WIDE:
            yield self._table()
        else:
            yield from self._blocks(piped=not console.is_terminal)


def findings_table(
    findings: Sequence[Finding], *, title: str | None = None, show_ok: bool = True
) -> FindingsView:
    return FindingsView(findings, title, show_ok)


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
