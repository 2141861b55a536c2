"""The `inferctl` entry point: the typer app, its subcommands, and the error boundary.

The boundary turns expected errors (InferctlError) into one line with a remedy and the documented
exit code; usage errors exit 64; Ctrl-C exits 130; anything unexpected prints one line and writes the
traceback to a debug log (`--debug` re-raises instead).
"""

from __future__ import annotations

import os
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

import infer_ctl.cli.check_gpu  # registers `check gpu` on check_cmd.app
import infer_ctl.cli.check_tokenizer  # noqa: F401  (registers `check tokenizer` on check_cmd.app)
from infer_ctl import __version__
from infer_ctl.cli import audit_cmd, check_cmd, exec_cmd, nodes_cmd, plan_cmd, profile_cmd, provision_cmd
from infer_ctl.core.exitcodes import ExitCode
from infer_ctl.errors import InferctlError

try:  # typer >= 0.16 vendors its own copy of click and raises that copy's exceptions
    from typer._click import exceptions as _click_exc  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # pragma: no cover - older typer depends on click proper
    import click.exceptions as _click_exc  # type: ignore[no-redef,unused-ignore]


def _classes(*candidates: object) -> tuple[type[BaseException], ...]:
    return tuple({c for c in candidates if isinstance(c, type) and issubclass(c, BaseException)})


# Catch every flavour so usage errors always exit 64 instead of surfacing as internal errors.
_EXIT = _classes(typer.Exit, getattr(_click_exc, "Exit", None))
_ABORT = _classes(getattr(typer, "Abort", None), getattr(_click_exc, "Abort", None))
_USAGE = _classes(_click_exc.ClickException)

app = typer.Typer(
    name="inferctl",
    help="Operate private SGLang inference clusters: prefill/decode disaggregation, speculative decoding, "
    "RDMA fabric, GPU health, and a PD-aware prefix-caching router.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"inferctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Re-raise unexpected errors with a traceback.")
    ] = False,
) -> None:
    """inferctl: one CLI, one YAML profile, one embedded controller."""


# Command modules, one per verb. Modules that add `check <family>` subcommands register themselves on
# check_cmd.app when imported, so they are imported here before the app runs.
app.add_typer(profile_cmd.app, name="profile")
app.add_typer(plan_cmd.app, name="plan")
app.add_typer(check_cmd.app, name="check")
from infer_ctl.cli import check_servers, launch_cmd  # noqa: E402, F401  (launch/status/stop/logs, check servers)

launch_cmd.register(app)
app.command("nodes")(nodes_cmd.nodes)
app.command("exec")(exec_cmd.exec_)
app.add_typer(provision_cmd.app, name="provision")
from infer_ctl.cli import router_cmd  # noqa: E402

app.add_typer(router_cmd.app, name="router")
from infer_ctl.cli import check_fabric  # noqa: E402, F401  (registers `check fabric` on check_cmd.app)

app.command("audit")(audit_cmd.audit_cmd)
from infer_ctl.cli import bench_cmd, demo_cmd, sim_cmd  # noqa: E402

app.add_typer(sim_cmd.app, name="sim")
app.command("bench")(bench_cmd.bench)
app.command("demo")(demo_cmd.demo)


def _debug_log_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "inferctl" / "debug.log"


def _log_traceback() -> Path | None:
    path = _debug_log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"--- {datetime.now(UTC).isoformat()} inferctl {' '.join(sys.argv[1:])}\n")
            fh.write(traceback.format_exc())
        return path
    except OSError:
        return None


def _print_error(exc: InferctlError) -> None:
    typer.echo(f"inferctl: error: {exc.message}", err=True)
    if exc.remedy:
        typer.echo(f"  hint: {exc.remedy}", err=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("INFERCTL_DEBUG") == "1"
    try:
        result = app(args=args, prog_name="inferctl", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except _EXIT as exc:
        return int(getattr(exc, "exit_code", 0))
    except _ABORT:
        typer.echo("inferctl: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except _USAGE as exc:
        # usage errors: unknown command, bad option value, missing argument
        exc.show()  # type: ignore[attr-defined]
        return ExitCode.USAGE
    except InferctlError as exc:
        if debug:
            raise
        _print_error(exc)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("inferctl: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # `inferctl ... | head`: the reader went away; not an error worth a traceback.
        sys.stderr.close()
        return ExitCode.OK
    except Exception as exc:
        if debug:
            raise
        where = _log_traceback()
        typer.echo(
            f"inferctl: internal error: {type(exc).__name__}: {exc}"
            + (f" (traceback in {where}; rerun with --debug)" if where else " (rerun with --debug)"),
            err=True,
        )
        return ExitCode.FAIL
