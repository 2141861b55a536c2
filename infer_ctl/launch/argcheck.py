"""Validation of rendered command lines with SGLang's own code (the `sglang` extra).

`ServerArgs.add_cli_args` builds SGLang's real argparse parser; `ServerArgs.from_cli_args` builds the
record from it. An unknown, ambiguous or mistyped flag fails here, on the controller, instead of
minutes into a model load on a GPU node. SGLang 0.5.23 validates most settings later, in
`ServerArgs.resolve_once()` (the hooks of sglang/srt/arg_groups/pipeline.py), which reads the model's
config and the GPU. The hooks that need neither run here too, as SGLang's own functions
(`run_model_free_hooks`): the HiCache ratio default, the PD disaggregation handler, the IB device
parser, the speculative algorithm's alias resolution and lookup, and the HiCache normalization
(`handle_hicache`); then the HiCache rules of `handle_cache_compatibility`, reproduced in
core/sglang/hicache_rules.py because its module needs transformers. A HiCache setting that those hooks
rewrite is reported too (`ArgCheck.rewrites`): the profile refuses rewrites, so what runs is what it
says. The model-dependent rules SGLang documents are judged without SGLang in core/sglang/consistency.py. Importing SGLang pulls in torch (~5 s), so it happens only when
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
from infer_ctl.core.sglang.consistency import effective_args
from infer_ctl.core.sglang.hicache_rules import cache_compatibility_error
from infer_ctl.errors import MissingExtraError

SGLANG_MODULE = "sglang.srt.server_args"


class ArgParseFailure(Exception):
    pass


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print and sys.exit(2)
        raise ArgParseFailure(message)


#: what `run_model_free_hooks` runs, in order (named as in SGLang 0.5.23); the HiCache ones are listed
#: only on a line that runs HiCache or decode KV offload
MODEL_FREE_HOOKS = ("handle_pd_disaggregation", "parse_ib_device_config", "speculative algorithm lookup",
                    "handle_hicache_ratio_default", "handle_hicache", "handle_cache_compatibility (HiCache rules)")
#: the ServerArgs fields HiCache's hooks may resolve differently from what the command line gave
HICACHE_FIELDS = ("hicache_host_memory_mode", "hicache_ratio", "hicache_size", "hicache_host_memory_fraction",
                  "hicache_write_policy", "hicache_io_backend", "hicache_mem_layout", "hicache_storage_backend",
                  "hicache_storage_prefetch_policy")  # fmt: skip


@dataclass(frozen=True)
class ArgCheck:
    instance: str
    node: str
    ok: bool
    error: str | None = None
    #: the SGLang hooks that ran (all of MODEL_FREE_HOOKS that apply, up to a failing one)
    hooks: list[str] = field(default_factory=list)
    #: HiCache settings SGLang's hooks resolve to another value than the command line's: flag -> (given, resolved)
    rewrites: dict[str, tuple[Any, Any]] = field(default_factory=dict)


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
    built, the way `run_resolution_pipeline` sets them up and in its order (arg_groups/pipeline.py);
    returns the names of those that ran. A hook's error is raised as ArgParseFailure naming the hook.
    SGLang's own functions, not copies:
    - `handle_hicache_ratio_default` (arg_groups/hicache_hook.py): the host-memory fraction's range, the
      default ratio, an explicit ratio/size turning the fraction off;
    - `handle_pd_disaggregation` (arg_groups/pd_disaggregation_hook.py): mooncake_tcp, decode host
      receive, radix cache, role switch, prefill_complete and DCP rules;
    - `parse_ib_device_config` (distributed/device_communicators/mooncake_transfer_engine.py) on the
      resolved --disaggregation-ib-device: the JSON map's syntax and keys (a `.json` path is a file on
      the node, and the device names are checked there, against its HCAs, by `launch`);
    - the speculative algorithm: `_resolve_speculative_algorithm_alias` (NEXTN -> EAGLE) and
      `SpeculativeAlgorithm.from_string` (arg_groups/speculative_hook.py, speculative/spec_info.py),
      without reading the draft's config (that needs the model);
    - `handle_hicache` (arg_groups/hicache_hook.py): buffer_only's rules, the layout / io backend / storage
      rewrites; not with --dcp-size > 1, where it reads the model's config (`use_mla_backend`);
    then the HiCache rules of `handle_cache_compatibility` on the resolved record, reproduced
    (`cache_compatibility_error`, core/sglang/hicache_rules.py: kv_cache_hook.py imports transformers)."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.arg_groups.hicache_hook import handle_hicache, handle_hicache_ratio_default
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
        except (ValueError, TypeError, AssertionError, KeyError, RuntimeError, NotImplementedError) as exc:
            raise ArgParseFailure(f"{name}: {type(exc).__name__}: {exc}") from exc
        ran.append(name)
        return result

    saved_env = dict(os.environ)  # handle_pd_disaggregation sets MC_FORCE_TCP for mooncake_tcp
    # the bookkeeping run_resolution_pipeline gives the record before its first hook
    sa._raw_input = {f.name: getattr(sa, f.name) for f in record_fields(type(sa))}
    sa._resolved_overrides = list(getattr(sa, "_resolved_overrides", ()))
    sa._input_frozen = True
    hicache = bool(sa.enable_hierarchical_cache or sa.disaggregation_decode_enable_offload_kvcache)
    try:
        if hicache:  # pipeline.py runs it before the PD handler
            step(MODEL_FREE_HOOKS[3], run_hook, handle_hicache_ratio_default, sa)
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
        if hicache:
            if (view.dcp_size or 1) <= 1:
                step(MODEL_FREE_HOOKS[4], run_hook, handle_hicache, sa)
            view = resolved_view(sa)
            fields = ("disaggregation_decode_retraction_backup", "disaggregation_mode", "radix_eviction_policy",
                      "radix_eviction_policy_config", "enable_hierarchical_cache", "disable_radix_cache",
                      "disaggregation_decode_enable_offload_kvcache", "hicache_storage_backend", "enable_lmcache",
                      "hicache_host_memory_mode")  # fmt: skip
            error = cache_compatibility_error({f: getattr(view, f) for f in fields})
            if error is not None:
                raise ArgParseFailure(f"{MODEL_FREE_HOOKS[5]}: ValueError: {error}")
            ran.append(MODEL_FREE_HOOKS[5])
    finally:
        sa._input_frozen = False
        os.environ.clear()
        os.environ.update(saved_env)
    return list(dict.fromkeys(ran))


#: fields SGLang fills in when the command line leaves them out (the default ratio; the fraction turned
#: off by an explicit size): a change there is SGLang's default at work, not a rewrite
DEFAULTED = ("hicache_ratio", "hicache_host_memory_fraction")


def hicache_rewrites(sa: Any, parsed: dict[str, Any], argv_flags: set[str]) -> dict[str, tuple[Any, Any]]:
    """The HiCache settings SGLang's hooks resolved to another value than the parser's (`parsed`), on a
    record `run_model_free_hooks` ran on: a flag given on the command line, or a default the hooks move
    because of another flag (the layout for a direct io backend)."""
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(sa)
    out: dict[str, tuple[Any, Any]] = {}
    for name in HICACHE_FIELDS:
        flag = "--" + name.replace("_", "-")
        if getattr(view, name) != parsed[name] and (flag in argv_flags or name not in DEFAULTED):
            out[flag] = (parsed[name], getattr(view, name))
    return out


def check_instances(rendered: list[tuple[Instance, list[str]]]) -> list[ArgCheck]:
    results = []
    for inst, argv in rendered:
        hooks: list[str] = []
        try:
            sa = parse_with_sglang(server_args(argv))
            given = {name: getattr(sa, name) for name in HICACHE_FIELDS}
            hooks = run_model_free_hooks(sa)
            rewrites = hicache_rewrites(sa, given, set(effective_args(argv)))
        except ArgParseFailure as exc:
            results.append(ArgCheck(inst.name, inst.node, False, str(exc), hooks))
        else:
            results.append(ArgCheck(inst.name, inst.node, True, None, hooks, rewrites))
    return results
