"""`provision --plan` prints identical node blocks once."""

from __future__ import annotations

import io

from rich.console import Console

from infer_ctl.core.provision.model import EntryKind, NodePlan, PlanEntry
from infer_ctl.provision.plan_table import render_plans


def _plan(node: str, after: str = "65536") -> NodePlan:
    entry = PlanEntry(node=node, step="limits", subject="nofile", kind=EntryKind.CHANGE, summary="raise nofile",
                      before="1024", after=after, diff="-1024\n+" + after)
    return NodePlan(node=node, entries=(entry,))


def test_identical_blocks_print_once_under_every_name() -> None:
    buf = io.StringIO()
    render_plans(Console(file=buf, width=100), [_plan("a"), _plan("b"), _plan("c", "4096"), _plan("d")], title="plan")
    out = buf.getvalue()
    assert "plan — nodes a, b, d: PENDING" in out
    assert "plan — c: PENDING" in out
    assert out.count("raise nofile") == 2
    assert "4 node(s) pending" in out  # the summary still counts nodes, not blocks
