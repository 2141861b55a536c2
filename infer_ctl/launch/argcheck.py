"""Validation of rendered command lines with SGLang's own parser (the `sglang` extra).

`ServerArgs.add_cli_args` builds SGLang's real argparse parser; `ServerArgs.from_cli_args` builds the
dataclass from it. An unknown, ambiguous or mistyped flag fails here, on the controller, instead of
minutes into a model load on a GPU node. Importing SGLang pulls in torch (~5 s), so it happens only
when asked (`inferctl launch --check-args`, the `sglang`-marked tests).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.sglang import Instance, server_args
from infer_ctl.errors import MissingExtraError

SGLANG_MODULE = "sglang.srt.server_args"


class ArgParseFailure(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and sys.exit(2)
        raise ArgParseFailure(message)


@dataclass(frozen=True)
class ArgCheck:
    instance: str
    node: str
    ok: bool
    error: str | None = None


def sglang_available() -> bool:
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def sglang_version() -> str | None:
    if not sglang_available():
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def _server_args_class() -> Any:
    if not sglang_available():
        raise MissingExtraError("sglang", "sglang", "Checking launch arguments with SGLang's own parser")
    # SGLang logs at import and construction; the check's verdict is the only output wanted
    logging.getLogger("sglang").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()):
        from sglang.srt.server_args import ServerArgs
    return ServerArgs


def parse_with_sglang(args: list[str]) -> Any:
    """SGLang's ServerArgs for `args` (the words after `-m sglang.launch_server`); raises ArgParseFailure."""
    server_args_cls = _server_args_class()
    parser = _RaisingParser(prog="sglang.launch_server", add_help=False)
    server_args_cls.add_cli_args(parser)
    ns = parser.parse_args(args)
    try:
        return server_args_cls.from_cli_args(ns)
    except (ValueError, TypeError, AssertionError) as exc:
        raise ArgParseFailure(f"{type(exc).__name__}: {exc}") from exc


def check_instances(rendered: list[tuple[Instance, list[str]]]) -> list[ArgCheck]:
    results = []
    for inst, argv in rendered:
        try:
            parse_with_sglang(server_args(argv))
        except ArgParseFailure as exc:
            results.append(ArgCheck(inst.name, inst.node, False, str(exc)))
        else:
            results.append(ArgCheck(inst.name, inst.node, True))
    return results
