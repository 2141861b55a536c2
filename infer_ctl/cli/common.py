"""Options and helpers shared by every command."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from infer_ctl.core.report import Report
from infer_ctl.exitcodes import ExitCode
from infer_ctl.output.console import make_consoles, progress_enabled
from infer_ctl.output.json_doc import write_report

if TYPE_CHECKING:
    from infer_ctl.launch.control_loop import LockedRounds
    from infer_ctl.profile import Node, Profile
    from infer_ctl.remote.fleet import Fleet

#: $INFERCTL_PROFILE is read by click for every --profile option (not only by the loader), so a command
#: sees the same value whether the profile came from -p or the variable: `router serve` with workers on
#: the command line ignored the variable but not -p, `demo` and `plan kv` never read it.
PROFILE_ENV = "INFERCTL_PROFILE"
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        envvar=PROFILE_ENV,
        help="Profile YAML (default: $INFERCTL_PROFILE, then ./inferctl.yaml; builtin:local for the shipped one).",
        show_default=False,
        show_envvar=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout; no progress.")]
NodesOpt = Annotated[
    str | None, typer.Option("--nodes", "-n", help="Comma-separated node names or globs, e.g. pf-01,dc-*.")
]
RoleOpt = Annotated[
    str | None, typer.Option("--role", "-r", help="Only nodes with this role: prefill or decode.")
]
_ROUTER_URL_HELP = "Router address: URL or HOST:PORT (default: the profile's router.listen)."
RouterUrlOpt = Annotated[str | None, typer.Option("--url", help=_ROUTER_URL_HELP, show_default=False)]
# check spec and spec control called it --router; kept as a second spelling (it means nothing else now:
# demo's --router became --front), listed in their help as deprecated
RouterUrlOldOpt = Annotated[
    str | None,
    typer.Option("--url", "--router", help=_ROUTER_URL_HELP + " --router: the old spelling, deprecated.",
                 show_default=False),
]


def router_base_url(text: str | None) -> str | None:
    """`127.0.0.1:8177` as `http://127.0.0.1:8177`: router.listen in the profile is HOST:PORT, so the same
    spelling on the command line is what a user types (it failed with "URL missing http://")."""
    if text is None or "://" in text:
        return text
    return f"http://{text}"


# Fleet options shared by every command that reaches nodes (nodes, exec, check *, audit, ...).
ParallelOpt = Annotated[
    int | None, typer.Option("--parallel", help="At most N nodes at once (default ssh.parallelism).")
]
AcceptNewHostKeysOpt = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-keys",
        help="Record unknown host keys in inferctl's known_hosts (changed keys are always refused).",
    ),
]


@dataclass
class Session:
    """Everything a command needs, passed explicitly: no module-level state."""

    json_mode: bool
    out: Console
    err: Console
    started: float = field(default_factory=time.monotonic)

    @property
    def progress(self) -> bool:
        return progress_enabled(self.err, self.json_mode)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def session(json_mode: bool = False) -> Session:
    out, err = make_consoles(json_mode=json_mode)
    return Session(json_mode=json_mode, out=out, err=err)


def given_profile(path: str | None) -> str | None:
    """The --profile value as the user gave it: None when click filled it from $INFERCTL_PROFILE, so the
    loader names that variable, not --profile, as where a missing file came from."""
    try:  # typer >= 0.16 vendors its own copy of click (cli/main.py)
        from typer._click.core import ParameterSource  # type: ignore[attr-defined,unused-ignore]
        from typer._click.globals import get_current_context  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # pragma: no cover - older typer depends on click proper
        from click.core import ParameterSource  # type: ignore[no-redef,assignment,unused-ignore]
        from click.globals import get_current_context  # type: ignore[no-redef,unused-ignore]

    ctx = get_current_context(silent=True)
    from_env = ctx is not None and ctx.get_parameter_source("profile") is ParameterSource.ENVIRONMENT
    if path is not None and from_env and path == os.environ.get(PROFILE_ENV):
        return None
    return path


def get_profile(path: str | None) -> Profile:
    # imported here: the pydantic models cost ~0.2 s, which `--help` of every command need not pay
    from infer_ctl.profile import load_profile

    return load_profile(given_profile(path))


def open_fleet(
    prof: Profile,
    select: str | None,
    role: str | None,
    *,
    parallel: int | None = None,
    accept_new_host_keys: bool = False,
) -> tuple[list[Node], Fleet]:
    """The selected nodes and a Fleet over them (enter it with `with`; it connects lazily, one
    connection per node). Imported here so `--help` does not load paramiko."""
    from infer_ctl.profile.select import select_nodes
    from infer_ctl.remote.fleet import Fleet

    chosen = select_nodes(prof, select, role)
    return chosen, Fleet(prof, accept_new_host_keys=accept_new_host_keys, parallel=parallel)


def finish(sess: Session, report: Report, render: Callable[[Console], None]) -> NoReturn:
    """Print the report (JSON or human) and exit with its exit code."""
    report.duration_s = sess.elapsed()
    if sess.json_mode:
        write_report(report)
    else:
        render(sess.out)
    raise typer.Exit(int(report.exit_code))


def finish_controller(sess: Session, command: str, profile_name: str, data: dict[str, Any], code: ExitCode,
                      loop: LockedRounds, render: Callable[[Console], None]) -> NoReturn:
    """`finish` for a fleet controller (`spec control`, `pd control`): its document also has the rounds
    skipped because another controller held the state lock (`skipped`: the last one's lock and holder,
    `skipped_rounds`). When no round ran at all, nothing was observed and nothing failed: unknown (3),
    told apart from an unreachable router by `skipped`, and said in place of the round's output.

    A loop's rounds that could not reach the router (it went on: `LockedRounds.outliving`) are
    `unreachable` (each spell of them) and `unreachable_rounds`; each is a round whose facts were not
    gathered, so the exit is the worst of the rounds as for every command (fail > unknown > warn > ok):
    2 when a switch or relaunch failed, else 3 when some round could not reach the router, else `code`."""
    from infer_ctl.launch.control_loop import skip_line, unreachable_line

    data = {**data, "skipped": loop.last_skip, "skipped_rounds": loop.rounds_skipped,
            "unreachable": loop.outages, "unreachable_rounds": loop.rounds_unreachable}
    if loop.rounds_unreachable and code != ExitCode.FAIL:
        code = ExitCode.UNKNOWN
    if loop.outages:  # why the exit is 3, after the rounds' own output
        rounds_render = render

        def render(c: Console) -> None:
            rounds_render(c)
            c.print(unreachable_line(loop), markup=False, highlight=False)
    skip = loop.last_skip
    if skip is not None and loop.rounds_run == 0:
        finish(sess, Report(command, profile_name, data=data, exit_code_override=ExitCode.UNKNOWN),
               lambda c: c.print(skip_line(skip), markup=False, highlight=False))
    finish(sess, Report(command, profile_name, data=data, exit_code_override=code), render)


@contextmanager
def status_line(sess: Session, message: str):
    """A spinner on stderr while something slow runs; silent in --json mode or off a terminal."""
    if sess.progress:
        with sess.err.status(message):
            yield
    else:
        yield


def seconds_parser(lo: float, hi: float | None = None, note: str = "") -> Callable[[str], float]:
    """A typer `parser=` for an option in seconds: a finite number from `lo` (to `hi`). typer's
    `min=`/`max=` alone read NaN as out of some bound it does not break (NaN fails every comparison) and
    let inf through a one-sided bound, so finite is tested first and the message names the whole range."""
    where = f" from {lo:g} to {hi:g}" if hi is not None else f", {lo:g} or more{note}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            raise typer.BadParameter(f"must be a number of seconds{where}, got {text!r}")
        return value

    return parse

