"""Human rendering of provisioning plans: one table per node, diffs below, a summary line.

Entries carry what the nodes sent (file contents in diffs, command output in summaries and errors):
every such text goes through `output/terminal_text.py`, so control sequences in it are shown as escapes
and `[...]` is never read as rich markup. The JSON plan keeps the exact text.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from infer_ctl.core.provision.model import EntryKind, NodePlan, NodeState
from infer_ctl.output.terminal_text import safe_cell, terminal_safe

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


def _diff_text(diff: str) -> Text:
    """A diff made terminal-safe line by line: a CR stays visible (`\\r`), since a CRLF line end can be
    the very change the diff shows."""
    return Text("\n".join(terminal_safe(line, multiline=False) for line in diff.rstrip("\n").split("\n")))


def _shape(plan: NodePlan) -> tuple[object, ...]:
    """What a node's block shows, without the node's name: equal shapes print once."""
    return (plan.state, plan.error, tuple((e.kind, e.step, e.subject, e.summary, e.diff, e.before, e.after, e.remedy)
                                          for e in plan.entries))


def group_plans(plans: Sequence[NodePlan]) -> list[tuple[list[str], NodePlan]]:
    """(node names, one plan) per distinct block, in first-seen order: three identical nodes are one block
    ("nodes a, b, c"), not three copies (a fresh 3-node cluster's plan was 391 lines)."""
    groups: dict[tuple[object, ...], tuple[list[str], NodePlan]] = {}
    for plan in plans:
        groups.setdefault(_shape(plan), ([], plan))[0].append(plan.node)
    return list(groups.values())


def render_plans(console: Console, plans: Sequence[NodePlan], *, title: str, show_diff: bool = True) -> None:
    for nodes, plan in group_plans(plans):
        who = f"nodes {', '.join(nodes)}" if len(nodes) > 1 else nodes[0]
        header = Text.assemble((f"{title} — {who}: ", "bold"), (plan.state.value.upper(), STATE_STYLE[plan.state]))
        console.print(header)
        if plan.error:
            console.print(safe_cell(f"  {plan.error}", style="red"))
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
                table.add_row(Text(e.kind.value.upper(), style=KIND_STYLE[e.kind]), safe_cell(e.step),
                              safe_cell(e.subject), safe_cell(summary))  # fmt: skip
            console.print(table)
        if show_diff:
            for e in plan.entries:
                if e.kind is EntryKind.CHANGE and e.diff:
                    console.print(safe_cell(f"  {e.step} {e.subject}:", style="bold"))
                    console.print(_diff_text(e.diff), highlight=False)
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
