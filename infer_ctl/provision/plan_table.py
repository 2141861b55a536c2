"""Human rendering of provisioning plans: one table per node, diffs below, a summary line."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from infer_ctl.core.provision.model import EntryKind, NodePlan, NodeState

KIND_STYLE = {
    EntryKind.OK: "green",
    EntryKind.CHANGE: "bold yellow",
    EntryKind.REBOOT_REQUIRED: "bold magenta",
    EntryKind.MANUAL: "magenta",
    EntryKind.WARN: "yellow",
    EntryKind.ERROR: "bold red",
    EntryKind.SKIP: "dim",
}
STATE_STYLE = {
    NodeState.OK: "green",
    NodeState.APPLIED: "green",
    NodeState.PENDING: "yellow",
    NodeState.ERROR: "bold red",
    NodeState.UNREACHABLE: "magenta",
    NodeState.SKIPPED: "dim",
}


def render_plans(console: Console, plans: Sequence[NodePlan], *, title: str, show_diff: bool = True) -> None:
    for plan in plans:
        header = Text.assemble((f"{title} — {plan.node}: ", "bold"), (plan.state.value.upper(), STATE_STYLE[plan.state]))
        console.print(header)
        if plan.error:
            console.print(Text(f"  {plan.error}", style="red"))
        if plan.entries:
            table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
            for col in ("kind", "step", "subject", "summary"):
                table.add_column(col, overflow="fold")
            for e in plan.entries:
                summary = e.summary
                if e.before is not None and e.after is not None and e.kind is not EntryKind.OK:
                    summary += f"\n{e.before} -> {e.after}"
                if e.remedy and e.kind not in (EntryKind.OK, EntryKind.SKIP):
                    summary += f"\n→ {e.remedy}"
                table.add_row(Text(e.kind.value.upper(), style=KIND_STYLE[e.kind]), e.step, e.subject, summary)
            console.print(table)
        if show_diff:
            for e in plan.entries:
                if e.kind is EntryKind.CHANGE and e.diff:
                    console.print(Text(f"  {e.step} {e.subject}:", style="bold"))
                    console.print(Text(e.diff.rstrip("\n")), highlight=False)
    counts: dict[str, int] = {}
    for plan in plans:
        counts[plan.state.value] = counts.get(plan.state.value, 0) + 1
    changes = sum(1 for p in plans for e in p.entries if e.kind is EntryKind.CHANGE)
    console.print(
        Text.assemble(
            ("summary: ", "bold"),
            ", ".join(f"{n} node(s) {s}" for s, n in sorted(counts.items())),
            f"; {changes} change(s) pending" if changes else "",
        )
    )
