"""The `inferctl` entry point: the typer app, its subcommands, and the error boundary.

The boundary turns expected errors (InferctlError) into one line with a remedy and the documented
exit code; usage errors exit 64; Ctrl-C exits 130; anything unexpected prints one line and writes the
traceback to a debug log (`--debug` re-raises instead).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from infer_ctl import __version__
from infer_ctl.checks.family_names import FAMILY_NAMES
from infer_ctl.core.report import Report
from infer_ctl.errors import InferctlError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.output.json_doc import dumps
from infer_ctl.paths import state_dir

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


def _version(value: bool) -> None:
    if value:
        typer.echo(f"inferctl {__version__}")
        raise typer.Exit(0)


def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Re-raise unexpected errors with a traceback.")
    ] = False,
) -> None:
    """inferctl: one CLI, one YAML profile, one embedded controller."""


def _new_app() -> typer.Typer:
    app = typer.Typer(
        name="inferctl",
        help="Operate private SGLang inference clusters: prefill/decode disaggregation, speculative decoding, "
        "RDMA fabric, GPU health, and a PD-aware prefix-caching router.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(_root)
    return app


# Command modules are imported lazily: only the verb being run is loaded, so `inferctl exec` does not
# pay for the router, the simulator or the tokenizer libraries. Root help (or an unknown verb) loads all.
# verb -> (module, attach); the dict order is the order of `inferctl --help`.
Attach = Callable[[typer.Typer, ModuleType], None]


def _typer(name: str) -> Attach:
    return lambda app, mod: app.add_typer(mod.app, name=name)


def _command(name: str, func: str) -> Attach:
    return lambda app, mod: app.command(name)(getattr(mod, func))


def _check_group(family: str | None) -> Attach:
    # Each family module adds `check <family>` to check_cmd.app when imported; only the requested one is
    # loaded (its libraries can be heavy), all of them for `check --help`.
    def attach(app: typer.Typer, mod: ModuleType) -> None:
        for name in [family] if family in FAMILY_NAMES else FAMILY_NAMES:
            importlib.import_module(f"infer_ctl.cli.check_{name}")
        app.add_typer(mod.app, name="check")

    return attach


def _launch_verbs(app: typer.Typer, mod: ModuleType) -> None:
    mod.register(app)


VERBS: dict[str, tuple[str, Attach]] = {
    "profile": ("infer_ctl.cli.profile_cmd", _typer("profile")),
    "nodes": ("infer_ctl.cli.nodes_cmd", _command("nodes", "nodes")),
    "exec": ("infer_ctl.cli.exec_cmd", _command("exec", "exec_")),
    "provision": ("infer_ctl.cli.provision_cmd", _typer("provision")),
    "check": ("infer_ctl.cli.check_cmd", _check_group(None)),
    "audit": ("infer_ctl.cli.audit_cmd", _command("audit", "audit_cmd")),
    "launch": ("infer_ctl.cli.launch_cmd", _launch_verbs),  # also status, stop, logs
    "router": ("infer_ctl.cli.router_cmd", _typer("router")),
    "spec": ("infer_ctl.cli.spec_cmd", _typer("spec")),
    "pd": ("infer_ctl.cli.pd_cmd", _typer("pd")),
    "plan": ("infer_ctl.cli.plan_cmd", _typer("plan")),
    "sim": ("infer_ctl.cli.sim_cmd", _typer("sim")),
    "bench": ("infer_ctl.cli.bench_cmd", _command("bench", "bench")),
    "demo": ("infer_ctl.cli.demo_cmd", _command("demo", "demo")),
}
ALIASES = {"status": "launch", "stop": "launch", "logs": "launch"}


def _requested_verb(args: Sequence[str]) -> str | None:
    for arg in args:
        if not arg.startswith("-"):
            return ALIASES.get(arg, arg)
    return None


def build_app(args: Sequence[str] | None = None) -> typer.Typer:
    """The typer app with the verb named in `args` attached, or every verb when none (or an unknown one)
    is named."""
    args = list(args or [])
    verb = _requested_verb(args)
    if verb in VERBS:
        wanted = [verb]
    elif verb is None and "--version" in args:
        wanted = []
    else:
        wanted = list(VERBS)
    app = _new_app()
    for name in wanted:
        module, attach = VERBS[name]
        if name == "check" and verb == "check":
            attach = _check_group(_requested_verb(args[args.index("check") + 1 :]))
        attach(app, importlib.import_module(module))
    return app


def click_command(app: typer.Typer) -> typer.core.TyperGroup:
    """The click command of `app` in the house help style (placeholders, examples: cli/helpfmt.py)."""
    from typer.main import get_command

    from infer_ctl.cli.helpfmt import polish

    return polish(get_command(app))


_HELP_FLAGS = {"--help", "-h", "--debug"}


def _is_root_help(args: Sequence[str]) -> bool:
    return all(a in _HELP_FLAGS for a in args)


def summary_app() -> typer.Typer:
    """Root help from the verbs' one-line summaries (cli/summaries.py), importing no command module:
    loading them all took 1.2-4 s for sixteen lines."""
    from infer_ctl.cli.summaries import SUMMARIES

    app = _new_app()
    for name, text in SUMMARIES.items():
        app.command(name, help=text, add_help_option=False)(_unreachable)
    return app


def _unreachable() -> None:  # pragma: no cover - a summary stub only prints in root help
    raise AssertionError("summary stubs are never run")


def _debug_log_path() -> Path:
    return state_dir() / "debug.log"


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


_GROUPS = {"profile", "plan", "check", "router", "sim", "provision", "spec", "pd"}


def _command_name(args: Sequence[str]) -> str:
    words: list[str] = []
    for arg in args:
        if (
            arg == "--"
            or arg.startswith("-")
            or len(words) == (2 if words[:1] and words[0] in _GROUPS else 1)
        ):
            break
        words.append(arg)
    return " ".join(words) or "inferctl"


def _json_error(args: Sequence[str], code: int, message: str, remedy: str | None) -> None:
    """In --json mode a failed command still prints one JSON document, so scripts always get one."""
    if "--json" not in args:
        return
    doc = Report(_command_name(args), None, exit_code_override=ExitCode(code)).to_dict()
    doc["error"] = {"message": message, "remedy": remedy}
    try:
        sys.stdout.write(dumps(doc) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass


def _retired_hint(args: Sequence[str], exc: BaseException) -> None:
    from infer_ctl.cli.renamed import replacement

    option = getattr(exc, "option_name", None)
    hint = replacement(_command_name(args), option) if option else None
    if hint:
        typer.echo(f"  hint: {hint}", err=True)


def main(argv: list[str] | None = None) -> int:
    return _run(sys.argv[1:] if argv is None else argv)


def _run(args: list[str]) -> int:
    debug = "--debug" in args or os.environ.get("INFERCTL_DEBUG") == "1"
    try:
        app = summary_app() if _is_root_help(args) else build_app(args)
        cmd = click_command(app)
        # context + invoke rather than cmd.main(): typer >= 0.29's main turns Ctrl-C into a plain return
        # value of 130, so the boundary below never saw the KeyboardInterrupt and exited 130 without the
        # "interrupted" line (or, with --json, without a document)
        with cmd.make_context("inferctl", list(args)) as ctx:
            result = cmd.invoke(ctx)
        return int(result) if isinstance(result, int) else 0
    except _EXIT as exc:
        return int(getattr(exc, "exit_code", 0))
    except _ABORT:
        typer.echo("inferctl: interrupted", err=True)
        _json_error(args, ExitCode.INTERRUPTED, "interrupted", None)
        return ExitCode.INTERRUPTED
    except _USAGE as exc:
        # usage errors: unknown command, bad option value, missing argument
        exc.show()  # type: ignore[attr-defined]
        _retired_hint(args, exc)
        _json_error(args, ExitCode.USAGE, exc.format_message(), "see --help")  # type: ignore[attr-defined]
        return ExitCode.USAGE
    except InferctlError as exc:
        if debug:
            raise
        _print_error(exc)
        _json_error(args, exc.exit_code, exc.message, exc.remedy)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        typer.echo("inferctl: interrupted", err=True)
        _json_error(args, ExitCode.INTERRUPTED, "interrupted", None)
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
        _json_error(args, ExitCode.FAIL, f"internal error: {type(exc).__name__}: {exc}", "rerun with --debug")
        return ExitCode.FAIL
