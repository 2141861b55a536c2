"""Control sequences from nodes never reach the operator's terminal through a table view, and JSON keeps
the exact text. Hostile output comes from stand-in commands on real sshd nodes."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from infer_ctl.core.findings import Finding
from infer_ctl.core.report import Report
from infer_ctl.output.table import findings_table, render_findings_report
from infer_ctl.output.terminal_text import terminal_safe
from tests.remote.helpers import run_cli, run_json

CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home
OSC52 = "\x1b]52;c;cm0gLXJmIH4K\x07"  # put "rm -rf ~" into the clipboard
OSC52_ST = "\x1b]52;c;cm0gLXJmIH4K\x1b\\"  # the same, ended by ST instead of BEL
C1_CSI = "\x9b31m"  # the 8-bit CSI
BIDI = "\u202eexe.txt\u202c"  # shown reversed
OVERWRITE = "all good\rFAILED  "  # \r: "FAILED" would be overwritten by "all good" on screen
HOSTILE = f"{CLEAR}before{OSC52}{OSC52_ST} {OVERWRITE} {C1_CSI}red {BIDI} bell\x07 nul\x00 del\x7f"
# what a terminal acts on; rich's own styling (SGR, ESC[...m) is removed before looking
ACTIVE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
SGR = re.compile(r"\x1b\[[0-9;]*m")


def _active(text: str) -> list[str]:
    return ACTIVE.findall(SGR.sub("", text))


def _flat(text: str) -> str:
    """The rendered text without styling, line breaks, table borders and spaces (cells wrap)."""
    return re.sub(r"[\s│┃]", "", SGR.sub("", text))


def test_terminal_safe_leaves_nothing_a_terminal_acts_on_and_shows_what_was_there():
    safe = terminal_safe(HOSTILE + "\ttab\r\nnext line\n")
    assert _active(safe) == []
    assert "\\x1b[2J" in safe and "\\x1b]52;c;cm0gLXJmIH4K\\x07" in safe and "\\x1b\\" in safe
    assert "all good\\rFAILED" in safe and "\\x9b31m" in safe and "\\u202eexe.txt\\u202c" in safe
    assert "\\x00" in safe and "\\x7f" in safe
    assert safe.endswith("\ttab\nnext line\n")  # tab and line breaks stay; CRLF is one line end
    assert terminal_safe("a\nb", multiline=False) == "a\\nb"
    assert terminal_safe("plain ünïcode — ok") == "plain ünïcode — ok"


@pytest.mark.parametrize("width", [200, 80])  # the table, and the narrow one-block-per-finding view
def test_findings_views_render_remote_text_inert_and_without_markup(width):
    finding = Finding.fail(
        "gpu.xid", "node-01\x1b[2J", "GPU0 [bold]", f"nvidia-smi said: {HOSTILE} [red]not markup[/red]",
        remedy=f"reboot {OSC52}",
    )
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system="truecolor")
    console.print(findings_table([finding], title="check gpu"))
    text = out.getvalue()
    assert _active(text) == [], repr(text)
    flat = _flat(text)
    assert "[red]notmarkup[/red]" in flat and "GPU0[bold]" in flat  # shown, not read as markup
    assert "\\x1b]52;c;" in flat and "node-01\\x1b[2J" in flat


def test_a_report_with_hostile_findings_keeps_the_exact_text_in_json():
    finding = Finding.warn("fabric.link", "node-01", "mlx5_0", HOSTILE)
    report = Report("check fabric", "p", findings=[finding])
    out = io.StringIO()
    render_findings_report(Console(file=out, width=200, force_terminal=True), report)
    assert _active(out.getvalue()) == []
    assert json.loads(json.dumps(report.to_dict()))["findings"][0]["message"] == HOSTILE


def _hostile_node(ssh_cluster):
    cluster = ssh_cluster(1)
    body = HOSTILE.encode("utf-8")
    octal = "".join(f"\\{b:03o}" for b in body)
    cluster.add_executable("node-01", "hostile", f"printf '{octal}\\n'; printf '{octal}\\n' >&2; exit 3\n")
    # `inferctl nodes` shows the kernel release, from uname
    cluster.add_executable(
        "node-01", "uname", f'case "$1" in -r) printf \'6.1{octal}\\n\' ;; *) exec /bin/uname "$@" ;; esac\n'
    )
    return cluster


@pytest.mark.ssh
def test_exec_table_shows_node_output_inert_and_json_keeps_it_exact(ssh_cluster, capsys, tmp_path):
    cluster = _hostile_node(ssh_cluster)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, out, _ = run_cli(capsys, "exec", "-p", str(path), "--", "hostile")
    assert code == 2
    assert _active(out) == [], repr(out)
    flat = _flat(out)
    assert "\\x1b[2J" in flat and "\\x1b]52;c;" in flat and "\\u202e" in flat
    code, doc = run_json(capsys, "exec", "-p", str(path), "--json", "--", "hostile")
    result = doc["results"][0]
    assert result["stdout"] == HOSTILE + "\n" and result["stderr"] == HOSTILE + "\n"


@pytest.mark.ssh
def test_nodes_table_shows_node_facts_inert(ssh_cluster, capsys, tmp_path):
    cluster = _hostile_node(ssh_cluster)
    path = cluster.write_profile(tmp_path / "p.yaml")
    code, out, _ = run_cli(capsys, "nodes", "-p", str(path))
    assert code == 0 and _active(out) == [], repr(out)
    code, doc = run_json(capsys, "nodes", "-p", str(path), "--json")
    assert doc["results"][0]["kernel"].startswith("6.1\x1b[2J")  # exact in JSON
