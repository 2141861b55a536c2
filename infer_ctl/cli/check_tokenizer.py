"""`inferctl check tokenizer`: draft/target tokenizer parity (docs/tokenizer.md)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from infer_ctl.cli.check_cmd import app
from infer_ctl.cli.common import JsonOpt, NodesOpt, ProfileOpt, RoleOpt, finish, session, status_line
from infer_ctl.core.findings import Status
from infer_ctl.core.report import Report
from infer_ctl.output.table import render_findings_report


@app.command("tokenizer")
def check_tokenizer(
    target: Annotated[str | None, typer.Option("--target", help="Target model directory (local).")] = None,
    draft: Annotated[str | None, typer.Option("--draft", help="Draft model directory (local).")] = None,
    probes: Annotated[
        str | None, typer.Option("--probes", help="Extra probes: a JSON list of strings, or one probe per line.")
    ] = None,
    fleet: Annotated[
        bool, typer.Option("--fleet", help="Verify the files' sha256 on every selected node over SSH, then compare once.")
    ] = False,
    profile: ProfileOpt = None,
    nodes: NodesOpt = None,
    role: RoleOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Compare the draft's tokenizer with the target's: vocabulary, merges, special tokens, templates, probes.

    Without --target/--draft, compares the pair named by the profile's models section."""
    # imported here, like the other families: `check tokenizer --help` loads no tokenizer or profile code
    from infer_ctl.checks.tokenizer import run_check_tokenizer

    sess = session(json_out)
    with status_line(sess, "comparing tokenizers"):
        findings, profile_name = run_check_tokenizer(
            target=target, draft=draft, probes_file=probes, fleet=fleet, profile_path=profile, nodes=nodes, role=role
        )
    report = Report("check tokenizer", profile_name, findings=findings)
    finish(sess, report, lambda console: render(console, report))


def render(console: Console, report: Report) -> None:
    """What was loaded, then only the rows that need attention (all rows when everything passed)."""
    for f in report.findings:
        if f.check == "tokenizer.files" and f.status is Status.OK:
            console.print(f"[{f.node}] {f.message}", highlight=False, markup=False)
    render_findings_report(console, report, show_ok=report.status is Status.OK)
