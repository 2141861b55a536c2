"""The exact `python -m sglang.launch_server` argument list of one instance.

The profile is rendered as (flag, value) options, then the user's extra args are merged: an extra arg
naming a flag the profile already set replaces it (the user wins, with an `ArgOverride` the CLI shows as
a warning, because the profile then no longer describes what runs). Flags are compared by SGLang's
canonical name, so `--tp 4` overrides `--tp-size 8`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from infer_ctl.core.sglang.flags import flag_table
from infer_ctl.core.sglang.hicache_argv import EVICTION_FLAG, hicache_flags
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.core.spec.pools import server_override
from infer_ctl.profile import Profile, SpecAlgorithm

LAUNCH_MODULE = "sglang.launch_server"


@dataclass(frozen=True)
class Option:
    flag: str
    value: str | None = None  # None: a switch such as --enable-metrics

    def tokens(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


@dataclass(frozen=True)
class ArgOverride:
    """An extra arg that replaced (or contradicts) a setting the profile rendered."""

    instance: str
    flag: str
    profile_value: str | None
    extra_value: str | None
    source: str  # "sglang.extra_args.decode" or "nodes[3].overrides.extra_args"

    @property
    def message(self) -> str:
        def show(v: str | None) -> str:
            return "(switch)" if v is None else v

        return (
            f"{self.instance}: {self.source} sets {self.flag} {show(self.extra_value)}, overriding the "
            f"profile's {show(self.profile_value)}"
        )


@dataclass(frozen=True)
class RenderedArgv:
    argv: list[str]
    overrides: list[ArgOverride]


def venv_python(profile: Profile) -> str:
    """The interpreter of the provisioned venv of this SGLang version (provision creates it)."""
    return f"{profile.sglang.venv.rstrip('/')}/{profile.sglang.version}/bin/python"


def _pinned_prefixes(profile: Profile) -> bool:
    return any(p.pin for p in profile.router.prefixes)


def ib_device_arg(profile: Profile, instance: Instance) -> str | None:
    """--disaggregation-ib-device: the per-GPU JSON map when configured, else the node's HCA list."""
    if instance.role != "prefill" and instance.role != "decode":
        return None
    if profile.sglang.transfer_backend == "mooncake_tcp":
        return None  # SGLang clears the device for TCP anyway; passing one would only mislead
    rdma = profile.node(instance.node).rdma
    if rdma is None:
        return None
    if rdma.device_map:
        visible = visible_device_map(rdma.device_map, instance.gpus)
        if visible:
            return json.dumps(visible, separators=(",", ":"))
    return ",".join(rdma.devices) or None


def visible_device_map(device_map: dict[str, str], gpus: tuple[int, ...]) -> dict[str, str]:
    """The node's map is keyed by PHYSICAL GPU index (what nvidia-smi and the fabric topology show);
    SGLang looks a map up by the GPU id the process sees, i.e. after CUDA_VISIBLE_DEVICES. A server on
    GPUs 4-7 of a node with both roles sees them as 0-3, so its map is re-keyed; without that it would
    register the HCAs of GPUs 0-3. A GPU with no entry is left out here and reported before launch
    (`launch.ib_device`): SGLang raises "No IB devices configured for GPU n" only once it is loading."""
    if not gpus:  # the node declares no GPUs: keys are taken as they are
        return dict(sorted(device_map.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0]))
    return {str(local): device_map[str(phys)] for local, phys in enumerate(gpus) if str(phys) in device_map}


IB_DEVICE_FLAG = "--disaggregation-ib-device"


def ib_device_names(value: str | None) -> tuple[str, ...]:
    """The HCA names in one --disaggregation-ib-device value, read the way SGLang 0.5.23 reads it
    (`parse_ib_device_config` in sglang/srt/distributed/device_communicators/mooncake_transfer_engine.py):
    a JSON map `{"<gpu>": "mlx5_0,mlx5_1", ...}` names every device of every entry; a path ending in
    `.json` is a file on the node, whose names are not known here; anything else is one comma-separated
    list shared by every GPU. Malformed JSON comes back whole, so it is reported as a device that does
    not exist (SGLang refuses to start with it)."""
    text = (value or "").strip()
    if not text or (text.endswith(".json") and not text.startswith("{")):
        return ()
    if text.startswith("{"):
        try:
            mapping = json.loads(text)
        except json.JSONDecodeError:
            return (text,)
        if isinstance(mapping, dict):
            text = ",".join(str(v) for v in mapping.values())
    return tuple(dict.fromkeys(v for v in re.split(r"[,\s]+", text) if v))


def sglang_ib_devices(profile: Profile, instance: Instance) -> tuple[str, ...]:
    """Every HCA SGLang is given by --disaggregation-ib-device on this instance: the flag's value in the
    rendered argv (`ib_device_arg`, or the extra arg that replaced it; the last one wins, as in
    argparse). None on a server that is not prefill/decode, and none with `mooncake_tcp`: SGLang 0.5.23
    clears the device for that backend (`handle_pd_disaggregation`, sglang/srt/arg_groups/
    pd_disaggregation_hook.py)."""
    args: dict[str, str | None] = {}
    for opt in parse_extra_args(server_args(build_argv(profile, instance).argv)):
        args[_canonical(opt.flag)] = opt.value
    if args.get(_canonical("--disaggregation-mode")) not in ("prefill", "decode"):
        return ()
    if args.get(_canonical("--disaggregation-transfer-backend")) == "mooncake_tcp":
        return ()
    return ib_device_names(args.get(_canonical(IB_DEVICE_FLAG)))


def profile_options(profile: Profile, instance: Instance) -> list[Option]:
    """The options the profile itself implies, before extra args."""
    opts: list[Option] = []
    add = opts.append
    models = profile.models
    if models is not None:
        add(Option("--model-path", models.target.path))
        if models.target.served_name:
            add(Option("--served-model-name", models.target.served_name))
        if models.target.tokenizer_path:
            add(Option("--tokenizer-path", models.target.tokenizer_path))
        if models.target.context_length:
            add(Option("--context-length", str(models.target.context_length)))
    add(Option("--tp-size", str(instance.tp)))
    add(Option("--dp-size", str(instance.dp)))
    if profile.sglang.mem_fraction_static is not None:
        add(Option("--mem-fraction-static", str(profile.sglang.mem_fraction_static)))
    add(Option("--host", instance.bind_host))
    add(Option("--port", str(instance.port)))
    if instance.role in ("prefill", "decode"):
        add(Option("--disaggregation-mode", instance.role))
        add(Option("--disaggregation-transfer-backend", profile.sglang.transfer_backend))
        if instance.bootstrap_port is not None:
            add(Option("--disaggregation-bootstrap-port", str(instance.bootstrap_port)))
        if profile.sglang.pd_role_switch:  # pd control's runtime switch (profile/pd.py)
            add(Option("--enable-pd-role-switch"))
        ib = ib_device_arg(profile, instance)
        if ib:
            add(Option(IB_DEVICE_FLAG, ib))
    if instance.nnodes > 1:
        add(Option("--nnodes", str(instance.nnodes)))
        add(Option("--node-rank", str(instance.node_rank)))
        if instance.dist_init_addr:
            add(Option("--dist-init-addr", instance.dist_init_addr))
    if instance.engine_info_port is not None:
        add(Option("--engine-info-bootstrap-port", str(instance.engine_info_port)))
    opts.extend(speculative_options(profile, instance))
    if profile.sglang.enable_metrics:
        add(Option("--enable-metrics"))
    if profile.sglang.enable_cache_report:
        add(Option("--enable-cache-report"))
    hicache = hicache_flags(profile, instance.role)
    if _pinned_prefixes(profile) and not any(flag == EVICTION_FLAG for flag, _ in hicache):
        # pinned prefixes are warmed with a high request priority; only the priority policy honours it
        # (a HiCache eviction_policy must then be priority too: profile/hicache.py)
        add(Option(EVICTION_FLAG, "priority"))
    if profile.sglang.kv_events is not None:
        # the same JSON on every server, prefill and decode (a decode without a radix cache binds but
        # sends nothing); SGLang moves the ports per DP rank itself, and two servers of one node that
        # would bind the same ports are a launch.kv_events FAIL (consistency.py), not rewritten here
        add(Option("--kv-events-config", profile.sglang.kv_events.to_json()))
    opts.extend(Option(flag, value) for flag, value in hicache)  # sglang.hicache (core/sglang/hicache_argv.py)
    return opts


def speculative_options(profile: Profile, instance: Instance | None = None) -> list[Option]:
    """The same draft on prefill and decode (SGLang requires P and D to run the same speculative setup);
    a decode pool may run its own step count or SGLang's adaptive mode (`speculative.pools`,
    core/spec/pools.py says why the prefills need not follow)."""
    draft = profile.models.draft if profile.models else None
    if draft is None:
        return []
    opts = [Option("--speculative-algorithm", draft.algorithm.value)]
    if draft.path:
        opts.append(Option("--speculative-draft-model-path", draft.path))
    pool = (server_override(profile, instance.node, instance.role, instance.config_dir)
            if instance is not None else None)
    numbers = (
        ("--speculative-num-steps", pool.num_steps if pool else draft.num_steps),
        ("--speculative-eagle-topk", pool.eagle_topk if pool else draft.eagle_topk),
        ("--speculative-num-draft-tokens", pool.num_draft_tokens if pool else draft.num_draft_tokens),
    )
    if pool is not None and pool.adaptive_config is not None:
        opts.append(Option("--speculative-adaptive"))
        opts.append(Option("--speculative-adaptive-config", pool.adaptive_config[0]))
    for flag, value in numbers:
        if value is not None:
            opts.append(Option(flag, str(value)))
    if draft.token_map and draft.algorithm is not SpecAlgorithm.NGRAM:
        opts.append(Option("--speculative-token-map", draft.token_map))
    return opts


def parse_extra_args(args: list[str]) -> list[Option]:
    """Split the user's extra args into options, using SGLang's table to tell switches from flags with
    a value. Unknown flags keep a following non-flag token as their value."""
    table = flag_table()
    opts: list[Option] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok.startswith("--") and "=" in tok:
            flag, value = tok.split("=", 1)
            opts.append(Option(flag, value))
            i += 1
            continue
        if tok.startswith("-"):
            spec = table.lookup(tok)
            takes = spec.takes_value if spec else (i + 1 < len(args) and not args[i + 1].startswith("--"))
            if takes and i + 1 < len(args):
                opts.append(Option(tok, args[i + 1]))
                i += 2
            else:
                opts.append(Option(tok))
                i += 1
            continue
        # a stray value (e.g. the second value of a nargs flag): keep it attached to the previous option
        opts.append(Option(tok))
        i += 1
    return opts


def _canonical(flag: str) -> str:
    spec = flag_table().lookup(flag)
    return spec.canonical if spec else flag


def extra_arg_sources(profile: Profile, instance: Instance) -> list[tuple[str, list[str]]]:
    index = next(i for i, n in enumerate(profile.nodes) if n.name == instance.node)
    role_args: list[str] = getattr(profile.sglang.extra_args, instance.role)
    return [
        (f"sglang.extra_args.{instance.role}", role_args),
        (f"nodes[{index}].overrides.extra_args", list(profile.nodes[index].overrides.extra_args)),
    ]


def build_argv(profile: Profile, instance: Instance) -> RenderedArgv:
    opts = profile_options(profile, instance)
    overrides: list[ArgOverride] = []
    for source, args in extra_arg_sources(profile, instance):
        for extra in parse_extra_args(args):
            key = _canonical(extra.flag)
            same = [o for o in opts if _canonical(o.flag) == key]
            for old in same:
                if old.value != extra.value or old.flag != extra.flag:
                    overrides.append(ArgOverride(instance.name, old.flag, old.value, extra.value, source))
            opts = [o for o in opts if _canonical(o.flag) != key] if extra.flag.startswith("-") else opts
            opts.append(extra)
    argv = [venv_python(profile), "-m", LAUNCH_MODULE]
    for opt in opts:
        argv.extend(opt.tokens())
    return RenderedArgv(argv=argv, overrides=overrides)


def render_argv(profile: Profile, instance: Instance, *, gid_index: int | None = None) -> list[str]:
    """The full command line. `gid_index` is accepted for symmetry with the env file (the GID index
    travels as MC_GID_INDEX in the environment, not as a flag)."""
    del gid_index
    return build_argv(profile, instance).argv


def server_args(argv: list[str]) -> list[str]:
    """The arguments after `python -m sglang.launch_server` (what SGLang's parser sees)."""
    try:
        return argv[argv.index(LAUNCH_MODULE) + 1 :]
    except ValueError:
        return argv[1:]
