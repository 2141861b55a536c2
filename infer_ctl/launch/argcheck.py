"""Validation of rendered command lines with SGLang's own code (the `sglang` extra).

`ServerArgs.add_cli_args` builds SGLang's real argparse parser; `ServerArgs.from_cli_args` builds the
record from it. An unknown, ambiguous or mistyped flag fails here, on the controller, instead of
minutes into a model load on a GPU node. SGLang 0.5.23 validates most settings later, in
`ServerArgs.resolve_once()` (the hooks of sglang/srt/arg_groups/pipeline.py), which reads the model's
config and the GPU. The hooks that need neither run here too, as SGLang's own functions
(`run_model_free_hooks`): the PD disaggregation handler, the IB device parser, and the speculative
algorithm's alias resolution and lookup. The model-dependent rules SGLang documents are judged without
SGLang in core/sglang/consistency.py. Importing SGLang pulls in torch (~5 s), so it happens only when
asked (`inferctl launch --check-args`, the `sglang`-marked tests).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.sglang import Instance, server_args
from infer_ctl.errors import MissingExtraError

SGLANG_MODULE = "sglang.srt.server_args"


class ArgParseFailure(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and sys.exit(2)
        raise ArgParseFailure(message)


#: what `run_model_free_hooks` runs, in order (named as in SGLang 0.5.23)
MODEL_FREE_HOOKS = ("handle_pd_disaggregation", "parse_ib_device_config", "speculative algorithm lookup")


@dataclass(frozen=True)
class ArgCheck:
    instance: str
    node: str
    ok: bool
    error: str | None = None
    #: the SGLang hooks that ran (all of MODEL_FREE_HOOKS that apply, up to a failing one)
    hooks: list[str] = field(default_factory=list)


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


def run_model_free_hooks(sa: Any) -> list[str]:
    """Run the resolution steps of SGLang 0.5.23 that need no model and no GPU, on the record the parser
    built, the way `run_resolution_pipeline` sets them up; returns the names of those that ran. A hook's
    error is raised as ArgParseFailure naming the hook. SGLang's own functions, not copies:
    - `handle_pd_disaggregation` (arg_groups/pd_disaggregation_hook.py): mooncake_tcp, decode host
      receive, radix cache, role switch, prefill_complete and DCP rules;
    - `parse_ib_device_config` (distributed/device_communicators/mooncake_transfer_engine.py) on the
      resolved --disaggregation-ib-device: the JSON map's syntax and keys (a `.json` path is a file on
      the node, and the device names are checked there, against its HCAs, by `launch`);
    - the speculative algorithm: `_resolve_speculative_algorithm_alias` (NEXTN -> EAGLE) and
      `SpeculativeAlgorithm.from_string` (arg_groups/speculative_hook.py, speculative/spec_info.py),
      without reading the draft's config (that needs the model)."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.arg_groups.pd_disaggregation_hook import handle_pd_disaggregation
    from sglang.srt.arg_groups.resolution_hooks import run_hook
    from sglang.srt.arg_groups.speculative_hook import _resolve_speculative_algorithm_alias
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import parse_ib_device_config
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ran: list[str] = []

    def step(name: str, fn: Any, *args: Any) -> Any:
        try:
            result = fn(*args)
        except (ValueError, TypeError, AssertionError, KeyError, RuntimeError) as exc:
            raise ArgParseFailure(f"{name}: {type(exc).__name__}: {exc}") from exc
        ran.append(name)
        return result

    saved_env = dict(os.environ)  # handle_pd_disaggregation sets MC_FORCE_TCP for mooncake_tcp
    # the bookkeeping run_resolution_pipeline gives the record before its first hook
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = list(getattr(sa, "_resolved_overrides", ()))
    sa._input_frozen = True
    try:
        step(MODEL_FREE_HOOKS[0], run_hook, handle_pd_disaggregation, sa)
        view = resolved_view(sa)
        device = view.disaggregation_ib_device
        if (
            view.disaggregation_transfer_backend == "mooncake"
            and view.disaggregation_mode in ("prefill", "decode")
            and device
            and not device.strip().endswith(".json")
        ):
            step(MODEL_FREE_HOOKS[1], parse_ib_device_config, device)
        if view.speculative_algorithm is not None:
            name = step(MODEL_FREE_HOOKS[2], _resolve_speculative_algorithm_alias,
                        str(view.speculative_algorithm).upper(), None)  # fmt: skip
            step(MODEL_FREE_HOOKS[2], SpeculativeAlgorithm.from_string, name)
    finally:
        sa._input_frozen = False
        os.environ.clear()
        os.environ.update(saved_env)
    return list(dict.fromkeys(ran))


def check_instances(rendered: list[tuple[Instance, list[str]]]) -> list[ArgCheck]:
    results = []
    for inst, argv in rendered:
        hooks: list[str] = []
        try:
            sa = parse_with_sglang(server_args(argv))
            hooks = run_model_free_hooks(sa)
        except ArgParseFailure as exc:
            results.append(ArgCheck(inst.name, inst.node, False, str(exc), hooks))
        else:
            results.append(ArgCheck(inst.name, inst.node, True, None, hooks))
    return results
