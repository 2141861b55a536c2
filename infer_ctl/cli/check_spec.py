"""`inferctl check spec`: is speculative decoding paying on each decode (docs/speculative.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from infer_ctl.cli.check_cmd import app
from infer_ctl.cli.common import (
    JsonOpt,
    ProfileOpt,
    RouterUrlOldOpt,
    finish,
    get_profile,
    router_base_url,
    session,
)
from infer_ctl.core.report import Report
from infer_ctl.output.table import render_findings_report


@app.command("spec")
def check_spec_cmd(
    profile: ProfileOpt = None,
    router: RouterUrlOldOpt = None,
    workers: Annotated[bool, typer.Option("--workers", help="Read each decode's /metrics and /server_info, not the router.")] = False,
    history: Annotated[Path | None, typer.Option("--history", help="Audit history (JSON lines) with the last `check tokenizer` result.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Measured acceptance (alpha) per decode vs the alert threshold and the speedup formula's break-even:
    OK, WARN (naming the recommended gamma), FAIL (slower than no speculation). Exit 0/1/2/3."""
    from infer_ctl.checks.spec import check_spec  # imported here so `--help` stays fast

    sess, prof = session(json_out), get_profile(profile)
    findings, data = check_spec(prof, router=router_base_url(router), history=history, use_router=not workers)
    report = Report("check spec", prof.name, findings=findings, data=data)
    finish(sess, report, lambda console: render_findings_report(console, report))
