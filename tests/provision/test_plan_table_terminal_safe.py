"""The provisioning plan table prints what the nodes sent (a config file's current contents in a diff,
command output in a summary or a node's error): terminal control sequences in it are shown as escapes,
never sent to the operator's terminal, and `[...]` is never read as rich markup. The JSON plan keeps
the exact text."""

from __future__ import annotations

import io

from rich.console import Console

from infer_ctl.core.provision.model import EntryKind, NodePlan, PlanEntry
from infer_ctl.provision.plan_table import render_plans

# clear screen, write the clipboard (OSC 52), reverse what follows (U+202E), markup, a bare CR
HOSTILE = "\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07[red]x[/red]\u202eevil\r"
RAW = ("\x1b[", "\x1b]", "\x07", "\u202e", "\r")


def _printed(plans: list[NodePlan]) -> str:
    out = io.StringIO()
    render_plans(Console(file=out, width=300, force_terminal=True, color_system=None), plans, title="plan")
    return out.getvalue()


def test_diff_summary_and_values_from_a_node_are_shown_as_escapes() -> None:
    entry = PlanEntry(
        node="pf-01",
        step="sysctl",
        subject="/etc/sysctl.d/90-inferctl.conf" + HOSTILE,
        kind=EntryKind.CHANGE,
        summary="rewrite: " + HOSTILE,
        diff=f"--- current\n+++ desired\n-{HOSTILE}\n+vm.swappiness = 1\n",
        before=HOSTILE,
        after="1",
    )
    text = _printed([NodePlan("pf-01", entries=(entry,))])
    assert not any(c in text for c in RAW), repr(text)
    # the subject (table and diff heading), the summary, the before value, the diff line
    assert text.count("\\x1b[2J") == 5 and text.count("\\x1b]52;c;cm0gLXJmIH4=\\x07") == 5, repr(text)
    assert text.count("[red]x[/red]") == 5 and text.count("\\u202eevil") == 5
    assert "+vm.swappiness = 1" in text
    assert entry.to_dict()["diff"] == f"--- current\n+++ desired\n-{HOSTILE}\n+vm.swappiness = 1\n"


def test_a_crlf_line_end_in_a_diff_stays_visible() -> None:
    entry = PlanEntry(node="pf-01", step="limits", subject="/etc/security/limits.d/90-inferctl.conf",
                      kind=EntryKind.CHANGE, summary="rewrite", diff="-* soft nofile 1048576\r\n+* soft nofile 1048576\n")  # fmt: skip
    text = _printed([NodePlan("pf-01", entries=(entry,))])
    assert "-* soft nofile 1048576\\r\n+* soft nofile 1048576\n" in text


def test_a_node_error_is_shown_as_escapes() -> None:
    text = _printed([NodePlan("dc-01", error="sudo: " + HOSTILE)])
    assert not any(c in text for c in RAW), repr(text)
    assert "sudo: \\x1b[2J\\x1b]52;c;" in text and "\\u202eevil\\r" in text
