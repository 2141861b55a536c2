"""The decode pools of a profile and the speculative settings each pool's servers are launched with.

A pool is a set of decode nodes (collocated nodes in a collocated profile) judged and changed together:
`speculative.pools` names them; every other such node is a pool of its own, named after the node. A pool
may run its own step count (`num_steps`) or SGLang's adaptive mode (`adaptive_steps`) instead of the
draft's `num_steps`; `core/sglang/argv.py` renders that on the pool's servers only. Prefills keep the
draft's settings: with EAGLE/EAGLE3 at topk 1 a prefill hands the decode the draft's first top-k token
and hidden state only, not a step count (SGLang 0.5.23 `speculative/eagle_disaggregation.py`,
`build_eagle_disagg_draft_input`: `num_states = speculative_eagle_topk`, times num_steps only for
multi-layer EAGLE), which is also why SGLang's adaptive mode may change a decode's steps at run time.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from infer_ctl.core.spec.adaptive import adaptive_applies, adaptive_config_text
from infer_ctl.core.spec.judge import SpecLimits
from infer_ctl.profile import Profile
from infer_ctl.profile.speculative import DEFAULT_COST_RATIO, SpecPool


def decode_steps_may_differ(args: dict[str, str | None]) -> bool:
    """Whether a decode with these effective args may run other steps than its prefills: single-layer
    EAGLE/EAGLE3 (NEXTN is EAGLE) at topk 1 (see the module docstring)."""
    algo = (args.get("--speculative-algorithm") or "").upper()
    return (algo in ("EAGLE", "EAGLE3", "NEXTN") and args.get("--speculative-eagle-topk") in (None, "1")
            and "--enable-multi-layer-eagle" not in args)


@dataclass(frozen=True)
class Pool:
    name: str
    #: node names, in profile order
    nodes: tuple[str, ...]
    #: the server role of its instances: decode, or collocated in a collocated profile
    role: str
    limits: SpecLimits
    #: index in speculative.pools; None for a node's implicit pool
    index: int | None
    #: the launch step count (None: speculation off, or SGLang's automatic choice)
    num_steps: int | None
    #: SGLang adaptive-mode candidates (None: static steps)
    adaptive_steps: tuple[int, ...] | None

    @property
    def adaptive(self) -> bool:
        return self.adaptive_steps is not None


def cost_ratio(profile: Profile, pool: SpecPool | None = None) -> float:
    if pool is not None and pool.cost_ratio is not None:
        return pool.cost_ratio
    c = profile.speculative.cost_ratio
    return DEFAULT_COST_RATIO if c is None else c


def base_limits(profile: Profile) -> SpecLimits:
    """The section's limits (a pool's unset keys, and decodes the profile does not describe)."""
    spec = profile.speculative
    return SpecLimits(alert_threshold=spec.alert_threshold, cost_ratio=cost_ratio(profile),
                      min_steps=spec.min_steps, max_steps=spec.max_steps)


def _server_nodes(profile: Profile) -> list[str]:
    return [n.name for n in profile.nodes if profile.collocated or n.has_role("decode")]


def pools(profile: Profile) -> list[Pool]:
    """Every pool: the profile's, then one per unlisted decode (or collocated) node."""
    spec = profile.speculative
    draft = profile.models.draft if profile.models else None
    role = "collocated" if profile.collocated else "decode"
    servers = _server_nodes(profile)
    out: list[Pool] = []
    listed: set[str] = set()
    for i, p in enumerate(spec.pools):
        nodes = tuple(n for n in servers if n in p.nodes)
        listed.update(nodes)
        limits = SpecLimits(alert_threshold=p.alert_threshold or spec.alert_threshold,
                            cost_ratio=cost_ratio(profile, p), min_steps=p.min_steps or spec.min_steps,
                            max_steps=p.max_steps or spec.max_steps)
        steps = p.num_steps or (draft.num_steps if draft else None)
        out.append(Pool(p.name, nodes, role, limits, i, steps,
                        tuple(sorted(set(p.adaptive_steps))) if p.adaptive_steps else None))
    base = base_limits(profile)
    for name in servers:
        if name not in listed:
            out.append(Pool(name, (name,), role, base, None, draft.num_steps if draft else None, None))
    return out


def pool_of(profile: Profile, node: str) -> Pool | None:
    return next((p for p in pools(profile) if node in p.nodes), None)


def adaptive_config_path(config_dir: str, role: str) -> str:
    """Where a server's --speculative-adaptive-config file lives on its node (next to its env file)."""
    return f"{config_dir.rstrip('/')}/sglang-{role}.spec-adaptive.json"


@dataclass(frozen=True)
class SpecOverride:
    """What a pool's server runs instead of the draft's numbers."""

    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    #: (path on the node, file content) of --speculative-adaptive-config; None: static steps
    adaptive_config: tuple[str, str] | None = None


def server_override(profile: Profile, node: str, role: str, config_dir: str) -> SpecOverride | None:
    """The pool settings of the server `role` on `node`, when its pool sets any (else None: the draft's)."""
    draft = profile.models.draft if profile.models else None
    if draft is None or draft.algorithm.value == "NGRAM" or role not in ("decode", "collocated"):
        return None
    if (role == "collocated") != profile.collocated:
        return None
    pool = next((p for p in profile.speculative.pools if node in p.nodes), None)
    if pool is None or (pool.num_steps is None and pool.adaptive_steps is None):
        return None
    cands = sorted(set(pool.adaptive_steps)) if pool.adaptive_steps else None
    steps = pool.num_steps or draft.num_steps or (cands[len(cands) // 2] if cands else None)
    if steps is None:
        return None
    topk = draft.eagle_topk or 1
    ndt = steps + 1 if topk == 1 else min(draft.num_draft_tokens or topk * steps + 1, topk * steps + 1)
    config = None
    if cands and adaptive_applies(draft.algorithm.value, topk):
        config = (adaptive_config_path(config_dir, role), adaptive_config_text(cands))
    return SpecOverride(steps, topk, ndt, config)


def with_pool_setting(profile: Profile, pool: Pool, num_steps: int, adaptive_steps: tuple[int, ...] | None) -> Profile:
    """The profile with `pool` running `num_steps` (and SGLang's adaptive mode among `adaptive_steps`):
    what the controller relaunches the pool from (the operator's file is not rewritten)."""
    spec = profile.speculative
    cands = list(adaptive_steps) if adaptive_steps else None
    new_pools = list(spec.pools)
    if pool.index is not None:
        new_pools[pool.index] = spec.pools[pool.index].model_copy(
            update={"num_steps": num_steps, "adaptive_steps": cands})
    else:
        new_pools.append(SpecPool(name=pool.name, nodes=list(pool.nodes), num_steps=num_steps, adaptive_steps=cands))
    derived = profile.model_copy(update={"speculative": spec.model_copy(update={"pools": new_pools})})
    return derived.with_base_dir(profile.base_dir)


def pool_change_yaml(pool: Pool, num_steps: int, adaptive_steps: tuple[int, ...] | None) -> str:
    """The profile change that makes `pool` run this setting, as YAML to paste (core renders no YAML
    library: the snippet is small and fixed in shape)."""
    where = (f"# in speculative.pools[{pool.index}] ({pool.name}):" if pool.index is not None
             else f"# add to speculative.pools (decode node {pool.name} has no pool entry yet):")
    lines = [where, "speculative:", "  pools:", f"    - name: {pool.name}",
             f"      nodes: [{', '.join(pool.nodes)}]", f"      num_steps: {num_steps}"]
    if adaptive_steps:
        lines.append(f"      adaptive_steps: [{', '.join(map(str, adaptive_steps))}]")
    elif pool.adaptive_steps:
        lines.append("      # and remove adaptive_steps")
    return "\n".join(lines) + "\n"


def apply_command(profile_ref: str, pool: Pool) -> str:
    """The one command that applies a pool's profile change: a rolling relaunch of its servers only."""
    return f"inferctl launch -p {profile_ref} --rolling --role {pool.role} --nodes {','.join(pool.nodes)}"
