"""`inferctl demo --scenario pd-shift`: rendering of the PD-shift demo (infer_ctl/bench/pd_demo.py)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from infer_ctl.bench.pd_demo import PdShiftOptions, run_pd_shift
from infer_ctl.cli.common import Session, finish, status_line
from infer_ctl.core.report import Report
from infer_ctl.errors import UsageError
from infer_ctl.exitcodes import ExitCode

CONTROLS = ("off", "act")


def pd_shift(sess: Session, *, control: str, seed: int, json_: bool) -> None:
    if control not in CONTROLS:
        raise UsageError(f"--control {control!r} is not a mode of the pd-shift demo", remedy="use act or off")
    opts = PdShiftOptions(control=control, seed=seed)
    with status_line(sess, "running the pd-shift demo (2P+2D simulated, router, PD balance controller)"):
        outcome = run_pd_shift(opts, log=lambda m: None if json_ else sess.err.print(f"[dim]demo: {m}[/dim]",
                                                                                     highlight=False))
    summary = outcome.summary(opts)
    report = Report(command="demo", profile="pd-shift", data={"scenario": "pd-shift", **summary})
    report.exit_code_override = ExitCode.OK if summary["failed"] == 0 else ExitCode.FAIL
    finish(sess, report, lambda console: render(console, summary, opts))


def render(console: Console, s: dict[str, Any], opts: PdShiftOptions) -> None:
    t = Table(title=f"inferctl demo: pd-shift (control {s['control']}; objectives TTFT {opts.ttft_slo_s:g} s, "
                    f"ITL {opts.itl_slo_s:g} s)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("window", "requests", "failed", "goodput req/s", "TTFT median s"):
        t.add_column(col, justify="left" if col == "window" else "right")
    rows = [("long prompts / short outputs", s["phase1"]), ("short prompts / long outputs", s["phase2"])]
    if "phase2_after_switch" in s:
        rows += [("  before the switch", s["phase2_before_switch"]), ("  after the switch", s["phase2_after_switch"])]
    for name, ph in rows:
        t.add_row(name, str(ph["requests"]), str(ph["failed"]), f"{ph['goodput_rps']}", f"{ph['ttft_median_s']}")
    console.print(t)
    before = sorted(s["roles_before"].values())
    after = sorted(s["roles_after"].values())
    console.print(f"split: {before.count('prefill')}P+{before.count('decode')}D -> "
                  f"{after.count('prefill')}P+{after.count('decode')}D", highlight=False)
    if "switch_after_shift_s" in s:
        console.print(f"switch done {s['switch_after_shift_s']} s after the shift", highlight=False)
