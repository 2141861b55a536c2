"""launch/status views print text the nodes' servers send (/server_info's model path and modes, the
log tail of a server that did not come up): terminal control sequences in it are shown as escapes,
never sent to the operator's terminal, and `[...]` is never read as rich markup. JSON stays exact."""

from __future__ import annotations

import io

from rich.console import Console

from infer_ctl.core.report import Report
from infer_ctl.launch.commands import render_launch, render_status

HOSTILE = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J[red]x[/red]\u202eevil\r"


def _printed(render, report: Report) -> str:
    out = io.StringIO()
    render(Console(file=out, width=200, force_terminal=True, color_system=None), report)
    return out.getvalue()


def test_status_table_shows_server_text_as_escapes():
    report = Report("status", "p")
    report.results = [{"instance": "pf-01-prefill", "process": "running", "health": "ok", "model": HOSTILE,
                       "disaggregation_mode": "prefill\x1b[31m"}]  # fmt: skip
    text = _printed(render_status, report)
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\u202e" not in text and "\r" not in text
    assert "\\x1b]52;c;" in text and "[red]x[/red]" in text and "\\u202e" in text


def test_log_tail_of_a_server_that_did_not_start_is_terminal_safe():
    report = Report("launch", "p")
    report.results = [{"instance": "dc-01-decode", "node": "dc-01", "action": "restarted", "state": "failed",
                       "elapsed_s": 3.0, "error": "exited " + HOSTILE, "log_tail": "Traceback\n" + HOSTILE + "\n"}]  # fmt: skip
    text = _printed(render_launch, report)
    assert "\x1b]" not in text and "\x1b[2J" not in text and "\u202e" not in text, repr(text)
    assert "\\x1b[2J" in text and "Traceback" in text
