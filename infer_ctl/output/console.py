"""Consoles: results to stdout, progress and logs to stderr (so --json stdout stays one document)."""

from __future__ import annotations

import sys

from rich.console import Console

from infer_ctl.output.fit import FitTables


def make_consoles(*, json_mode: bool = False, no_color: bool = False) -> tuple[Console, Console]:
    out = Console(file=sys.stdout, no_color=no_color, soft_wrap=False, highlight=False)
    # piped or redirected: lines as long as they are (a reader or a file has no width to fit), tables as
    # plain columns or key: value blocks (output/fit.py); on a terminal, tables too wide fold to blocks
    out.soft_wrap = not out.is_terminal
    out.push_render_hook(FitTables())
    err = Console(file=sys.stderr, no_color=no_color, highlight=False, quiet=False)
    err.soft_wrap = not err.is_terminal  # progress lines redirected to a log: one line each, never folded
    return out, err


def progress_enabled(err: Console, json_mode: bool) -> bool:
    """Live progress only on an interactive terminal and never in --json mode."""
    return err.is_terminal and not json_mode
