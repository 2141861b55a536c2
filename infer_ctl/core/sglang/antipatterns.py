"""The seed's speculative/PD anti-patterns as WARNs before launch (issue 29): each runs, and each costs
throughput or latency in a way nothing at start-up reports. Judged on the effective command lines, like
core/sglang/consistency.py; `profile validate` and `launch --dry-run` show them. Each names the field to
change in `details["field"]`.
"""

from __future__ import annotations

import json
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.core.sizing.presets import model_preset
from infer_ctl.core.sizing.spec import break_even_alpha, speedup
from infer_ctl.profile import Profile

DRAFT_SIZE = "launch.draft_size"
CHUNKED_PREFILL = "launch.chunked_prefill"
SPEC_LOOKAHEAD = "launch.spec_lookahead"
KV_STORAGE_NIC = "launch.kv_storage_nic"

#: above this draft/target step cost the draft eats most of what it saves (the seed: c > 0.10)
MAX_COST_RATIO = 0.10
#: the acceptance assumed before any is measured (an EAGLE3 head on chat traffic; `check spec` measures it)
ASSUMED_ALPHA = 0.7
#: SGLang's usual step count when the profile leaves the speculative numbers to it
ASSUMED_GAMMA = 3
#: a context from which one unchunked prefill holds a GPU for seconds
LONG_CONTEXT = 32_768
#: lookahead from which acceptance at the tail positions needs low-temperature (near-greedy) sampling
HIGH_GAMMA = 6
#: storage backends that stay on the node (no NIC): HiCache's file tier on local disk, shared memory
LOCAL_STORAGE = ("file", "shm")


def _int(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _node_index(profile: Profile, name: str) -> int:
    return next(i for i, n in enumerate(profile.nodes) if n.name == name)


def _cost_ratios(profile: Profile) -> list[tuple[str, float, str]]:
    """(field, c, where c came from): the profile's own ratios, else the presets' parameter ratio."""
    spec = profile.speculative
    found = [("speculative.cost_ratio", spec.cost_ratio, "speculative.cost_ratio")] if spec.cost_ratio else []
    found += [(f"speculative.pools[{i}].cost_ratio", p.cost_ratio, f"pool {p.name}")
              for i, p in enumerate(spec.pools) if p.cost_ratio]
    models = profile.models
    if found or models is None or models.draft is None or not models.draft.preset or not models.target.preset:
        return found
    try:
        draft, target = model_preset(models.draft.preset), model_preset(models.target.preset)
    except ValueError:
        return found
    # a decode step reads every active weight once, so step cost follows active parameters
    ratio = draft.flops_params / target.flops_params
    return [("models.draft.preset", ratio, f"{models.draft.preset} / {models.target.preset} parameters")]


def _draft_size(profile: Profile) -> list[Finding]:
    draft = profile.models.draft if profile.models else None
    if draft is None or draft.algorithm.value == "NGRAM":
        return []
    gamma = draft.num_steps or ASSUMED_GAMMA
    out = []
    for field, c, source in _cost_ratios(profile):
        if c <= MAX_COST_RATIO:
            continue
        be = break_even_alpha(gamma, c)
        s = speedup(ASSUMED_ALPHA, gamma, c)
        be_text = f"break-even alpha {be:.2f}" if be is not None else "no alpha below 1 breaks even"
        out.append(Finding.warn(
            DRAFT_SIZE, "-", "draft",
            f"{field}: draft cost ratio c = {c:.3f} ({source}) is above {MAX_COST_RATIO}: at gamma {gamma}, "
            f"{be_text}; speedup {s:.2f}x at an assumed alpha {ASSUMED_ALPHA}",
            details={"field": field, "cost_ratio": round(c, 4), "gamma": gamma, "break_even_alpha": be,
                     "assumed_alpha": ASSUMED_ALPHA, "speedup_at_assumed_alpha": round(s, 3)},
            remedy="use a smaller draft (an EAGLE3 head, or a model near a tenth of the target or less), or "
            "fewer steps; `inferctl plan spec --cost-ratio C` shows the speedup grid and `inferctl check spec` "
            "the measured alpha",
        ))  # fmt: skip
    return out


def extra_args_source(profile: Profile, inst: Instance, flag: str) -> str | None:
    """The extra-args field that gives `flag` to this instance: the node's overrides (appended last, so
    they win) before the role's list; None when neither has it (the value is rendered from a profile field)."""
    def has(args: list[str]) -> bool:
        return any(tok == flag or tok.startswith(flag + "=") for tok in args)

    i = _node_index(profile, inst.node)
    if has(profile.nodes[i].overrides.extra_args):
        return f"nodes[{i}].overrides.extra_args"
    role_args = getattr(profile.sglang.extra_args, inst.role, None)
    return f"sglang.extra_args.{inst.role}" if isinstance(role_args, list) and has(role_args) else None


def _context(profile: Profile, args: dict[str, str | None]) -> int | None:
    ctx = _int(args.get("--context-length"))
    if ctx is None and profile.models is not None:
        target = profile.models.target
        ctx = target.context_length
        if ctx is None and target.preset:
            try:
                ctx = model_preset(target.preset).context_length
            except ValueError:
                ctx = None
    return ctx


def _chunked_prefill(profile: Profile, inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    """One unchunked long prompt holds the server for the whole prefill: every other request's prefill
    (and, collocated, every decode step) waits, and activation memory peaks with the prompt."""
    chunk = _int(args.get("--chunked-prefill-size"))
    ctx = _context(profile, args)
    if inst.role == "decode" or chunk is None or ctx is None or ctx < LONG_CONTEXT:
        return []
    if 0 < chunk <= ctx:
        return []
    # SGLang's scheduler turns any size <= 0 into "no chunking" (scheduler.py: chunked_prefill_size <= 0 -> None)
    what = f"off ({chunk})" if chunk <= 0 else f"{chunk:,}, above the context {ctx:,} (never splits)"
    field = extra_args_source(profile, inst, "--chunked-prefill-size") or f"sglang.extra_args.{inst.role}"
    return [Finding.warn(
        CHUNKED_PREFILL, inst.node, inst.name,
        f"{field}: --chunked-prefill-size {what} on a {ctx:,}-token model: a long prompt's prefill runs in "
        "one piece, stalling every other request behind it (TTFT spikes) and peaking activation memory",
        details={"field": field, "chunked_prefill_size": chunk, "context_length": ctx},
        remedy="set --chunked-prefill-size 8192 (or 4096-16384; SGLang's default when unset) so long prefills "
        "interleave with other work",
    )]  # fmt: skip


def _lookahead(profile: Profile, inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    steps = _int(args.get("--speculative-num-steps"))
    if inst.role not in ("decode", "collocated") or steps is None or steps < HIGH_GAMMA:
        return []
    pools = [i for i, p in enumerate(profile.speculative.pools) if inst.node in p.nodes and p.num_steps]
    field = (extra_args_source(profile, inst, "--speculative-num-steps")
             or (f"speculative.pools[{pools[0]}].num_steps" if pools else "models.draft.num_steps"))
    return [Finding.warn(
        SPEC_LOOKAHEAD, inst.node, inst.name,
        f"{field}: lookahead gamma {steps} (>= {HIGH_GAMMA}) pays only on low-temperature traffic: acceptance "
        "falls with each drafted position and with the sampling temperature, so at high temperatures "
        "(above ~1) the deep tail is drafted, verified and thrown away",
        details={"field": field, "gamma": steps, "threshold": HIGH_GAMMA},
        remedy="serve gamma >= 6 only to near-greedy traffic (a pool of its own, speculative.pools), or lower "
        "num_steps (3-5); `inferctl check spec` shows the acceptance per pool",
    )]  # fmt: skip


def _devices(value: str | None) -> set[str]:
    """HCA names of --disaggregation-ib-device: "mlx5_0,mlx5_1" or a per-GPU JSON map of such lists."""
    if not value:
        return set()
    try:
        parsed: Any = json.loads(value)
    except ValueError:
        parsed = value
    parts = parsed.values() if isinstance(parsed, dict) else [parsed]
    return {d.strip() for p in parts for d in str(p).split(",") if d.strip()}


def _kv_storage_nic(profile: Profile, inst: Instance, args: dict[str, str | None]) -> list[Finding]:
    """HiCache's storage tier and PD's KV transfer on the same RDMA NICs: a prefetch or write-back burst
    queues in front of the transfer every decode waits on (TTFT), and no traffic class separates them."""
    hc = profile.sglang.hicache
    settings = hc.settings_for(inst.role) if hc is not None else None
    storage = settings.storage if settings is not None else None
    rdma = profile.node(inst.node).rdma
    if (storage is None or storage.backend in LOCAL_STORAGE or inst.role not in ("prefill", "decode")
            or profile.sglang.transfer_backend == "mooncake_tcp" or rdma is None or not rdma.devices):
        return []
    kv = _devices(args.get("--disaggregation-ib-device")) or set(rdma.devices)
    cfg = storage.extra_config if isinstance(storage.extra_config, dict) else {}
    own = _devices(str(cfg.get("device_name") or "")) if cfg.get("device_name") else set()
    if own and not own & kv:
        return []  # the storage backend has NICs of its own
    own_role = hc is not None and getattr(hc, inst.role) is not None and getattr(hc, inst.role).storage is not None
    field = f"sglang.hicache.{inst.role}.storage" if own_role else "sglang.hicache.storage"
    shared = sorted(own & kv) if own else sorted(kv)
    return [Finding.warn(
        KV_STORAGE_NIC, inst.node, inst.name,
        f"{field}: the {storage.backend} storage tier and the KV transfer share {', '.join(shared)} on "
        f"nodes[{_node_index(profile, inst.node)}]: storage prefetch and write-back bursts queue in front of "
        "the prefill-to-decode KV transfer",
        details={"field": field, "backend": storage.backend, "kv_devices": sorted(kv), "shared": shared},
        remedy="give the storage backend NICs of its own (mooncake: extra_config device_name), or at least its "
        "own traffic class/priority; or keep the storage tier off the PD roles",
    )]  # fmt: skip


def antipattern_findings(profile: Profile, chosen: list[Instance], args: dict[str, dict[str, str | None]]) -> list[Finding]:
    """WARNs (never FAILs: each runs) for the leaders among `chosen`; `args` by instance name."""
    out = _draft_size(profile) if chosen else []
    for inst in chosen:
        if inst.is_leader:
            a = args[inst.name]
            out += _chunked_prefill(profile, inst, a) + _lookahead(profile, inst, a) + _kv_storage_nic(profile, inst, a)
    return out
