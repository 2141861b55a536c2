"""`inferctl profile init|validate|show`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.syntax import Syntax

from infer_ctl.cli.common import JsonOpt, ProfileOpt, finish, given_profile, session
from infer_ctl.cli.profile_init import init
from infer_ctl.core.findings import Finding
from infer_ctl.core.report import Report
from infer_ctl.core.sglang.consistency import launch_problems
from infer_ctl.core.sglang.kv_page import kv_page_findings
from infer_ctl.errors import ProfileError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.output.table import render_findings_report
from infer_ctl.profile import load_profile, resolve_profile_path
from infer_ctl.profile.model_config import local_model_config

#: launch-plan warnings `profile validate` shows (the others are `launch --dry-run`'s)
VALIDATE_WARNINGS = ("launch.hicache", "launch.override", "launch.draft_size", "launch.chunked_prefill",
                     "launch.spec_lookahead", "launch.kv_storage_nic", "launch.gpus_uneven")

app = typer.Typer(help="Write a first profile, validate it, show it resolved.", no_args_is_help=True)
app.command("init")(init)


@app.command("validate")
def validate(profile: ProfileOpt = None, json: JsonOpt = False) -> None:
    """Check a profile: every problem is listed with its field path; exit 0 if valid, 1 with warnings
    (HiCache best practices, KV page alignment), 64 if not (including a launch plan that would fail)."""
    sess = session(json)
    path = resolve_profile_path(given_profile(profile))
    report = Report(command="profile validate", profile=None)
    try:
        prof = load_profile(path)
    except ProfileError as exc:
        report.findings = [Finding.fail("profile.schema", "-", str(path), line) for line in exc.errors]
        report.exit_code_override = exc.exit_code
        if not json:
            for line in exc.errors:
                typer.echo(
                    f"inferctl: error: {line if line.startswith(str(path)) else f'{path}: {line}'}", err=True
                )
            if exc.remedy and len(exc.errors) == 1:
                typer.echo(f"  hint: {exc.remedy}", err=True)
        finish(sess, report, lambda c: None)
    report.profile = prof.name
    roles = {r: len(prof.nodes_with_role(r)) for r in ("prefill", "decode")}
    report.findings = [Finding.ok("profile.schema", "-", str(path), "profile is valid")]
    # launch-plan FAILs too (e.g. prefill and decode disagreeing on --page-size): servers with these
    # arguments would fail at start-up or at the first transfer (docs/launch.md, "Checks before launch"),
    # so the profile is invalid (exit 64); the HiCache and KV page warnings (best practices, alignment)
    # are shown with exit 1
    problems = launch_problems(prof)
    plan_fails = [f for f in problems if f.status.value == "fail"]
    report.findings += plan_fails
    report.findings += [f for f in problems if f.status.value == "warn" and f.check in VALIDATE_WARNINGS]
    report.findings += kv_page_findings(prof, config=local_model_config(prof))
    if plan_fails:
        report.exit_code_override = ExitCode.USAGE
    report.data = {"path": str(path), "nodes": len(prof.nodes), "roles": roles, "collocated": prof.collocated}

    def render(console: Console) -> None:
        if not plan_fails:
            mode = "collocated" if prof.collocated else f"{roles['prefill']} prefill + {roles['decode']} decode"
            console.print(
                f"[green]valid[/green]: {path} — profile {prof.name!r}, {len(prof.nodes)} nodes ({mode})"
            )
        if any(f.status.value != "ok" for f in report.findings):
            render_findings_report(console, report, show_ok=False)

    finish(sess, report, render)


@app.command("show")
def show(
    profile: ProfileOpt = None,
    json: JsonOpt = False,
    yaml_out: Annotated[
        bool, typer.Option("--yaml", help="Print YAML instead of a highlighted view.")
    ] = False,
) -> None:
    """Print the resolved profile with every default filled in. Piped or redirected, it is plain YAML that
    reloads to the same profile (`inferctl profile show > mine.yaml`)."""
    sess = session(json)
    path = resolve_profile_path(given_profile(profile))
    prof = load_profile(path)
    data = prof.model_dump(mode="json")
    if json:
        # the standard envelope (docs/json-output.md), the resolved profile under "resolved": a script
        # reads command, status and exit_code here as from every other command (it was the bare mapping)
        finish(sess, Report(command="profile show", profile=prof.name, data={"path": str(path), "resolved": data}),
               lambda c: None)
    import sys

    import yaml

    # width: PyYAML folds long scalars at 80 columns by default; the folded form reloads the same, but a
    # profile is a file people grep and diff, so one value stays on one line
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 30)
    if yaml_out or not sys.stdout.isatty():
        # piped or redirected (`profile show > x.yaml`): the YAML itself, byte for byte. rich would crop
        # each line at the console width (80 when not a terminal) and pad the end, which cut values
        # ("RoCEv2 400G" -> "RoCEv2 40") in a file that still validated (issue 29)
        typer.echo(text, nl=False)
    else:
        # on a terminal: highlighted, and wrapped rather than cropped, so no value is hidden
        Console().print(Syntax(text, "yaml", background_color="default", word_wrap=True))
    raise typer.Exit(0)
