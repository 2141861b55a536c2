"""The simulated cluster a profile describes: one worker per (node, server role), at the node's address
and the profile's ports, with the profile's model and speculative settings."""

from __future__ import annotations

from typing import Any

from infer_ctl.profile import Profile
from infer_ctl.sim.config import Role, WorkerSpec
from infer_ctl.sim.timing import DEFAULT_PRESET, PRESETS


def sim_preset_for(model_preset: str | None, speculative: bool) -> str:
    """The simulator preset of a sizing model preset (e.g. llama-3.1-70b), else the default."""
    if model_preset:
        matches = [p for p in PRESETS.values() if p.model == model_preset.lower()]
        for p in matches:
            if (p.spec_alpha is not None) == speculative:
                return p.name
        if matches:
            return matches[0].name
    return DEFAULT_PRESET


def specs_from_profile(profile: Profile, **knobs: Any) -> list[WorkerSpec]:
    """`knobs` are WorkerSpec fields applied to every worker (time_scale, seed, cache_capacity_tokens...)."""
    if profile.models is None:
        raise ValueError(f"profile {profile.name!r} has no models section: the simulator needs the target model")
    target = profile.models.target
    draft = profile.models.draft
    model = target.served_name or target.path
    spec_knobs: dict[str, Any] = {"speculative": draft is not None}
    if draft is not None and draft.num_steps:
        spec_knobs["spec_gamma"] = draft.num_steps
    if draft is not None:  # what `router spec`, the request spans and check servers then name
        spec_knobs.update(spec_algorithm=draft.algorithm.value, draft_model=draft.path)
    base = {"preset": sim_preset_for(target.preset, draft is not None), "model": model, **spec_knobs}
    if target.context_length:
        base["context_length"] = target.context_length
    if profile.sglang.kv_events is not None:
        base["kv_events_config"] = profile.sglang.kv_events.to_json()  # what launch renders
    seed = int(knobs.pop("seed", 0))
    specs: list[WorkerSpec] = []
    for node in profile.nodes:
        ports = profile.server_ports(node)
        roles: list[tuple[Role, int, int | None]] = []
        if "collocated" in ports:
            roles.append(("mixed", ports["collocated"], None))
        if "prefill" in ports:
            roles.append(("prefill", ports["prefill"], ports["bootstrap"]))
        if "decode" in ports:
            roles.append(("decode", ports["decode"], None))
        for role, port, boot in roles:
            server_role = "collocated" if role == "mixed" else role
            extra = [*getattr(profile.sglang.extra_args, server_role), *node.overrides.extra_args]
            page = _flag_value(extra, "--page-size")
            paged: dict[str, Any] = {"page_size": int(page)} if page and page.isdigit() else {}
            kv = _flag_value(extra, "--kv-events-config")  # an extra arg replaces the profile's, as in launch
            if kv is not None:
                paged["kv_events_config"] = kv
            paged.update(hicache_knobs(profile, server_role))
            specs.append(
                WorkerSpec(role, host=node.host, port=port, bootstrap_port=boot, seed=seed + len(specs),
                           **{**base, **paged, **knobs})
            )
    return specs


def _flag_value(args: list[str], flag: str) -> str | None:
    """The last value given to `flag` in an extra-args list (`--flag V` or `--flag=V`), as argparse reads it."""
    value = None
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            value = args[i + 1]
        elif tok.startswith(flag + "="):
            value = tok.split("=", 1)[1]
    return value


def hicache_knobs(profile: Profile, server_role: str) -> dict[str, Any]:
    """The WorkerSpec fields of the profile's `sglang.hicache` for a server role (sim/tiers.py): the host
    pool's ratio or size (SGLang's default ratio 2.0 when the profile leaves it to SGLang's auto-sizing,
    which needs the node's RAM), write policy, storage backend and prefetch policy. A decode gets them
    with `decode.mode: radix` (its own prefix cache); `offload` (finished KV written to storage for the
    prefills to find) is not simulated: such a decode runs no radix cache, as SGLang's does."""
    hc = profile.sglang.hicache
    s = hc.settings_for(server_role) if hc is not None else None
    mode = hc.decode_mode() if hc is not None and server_role == "decode" else None
    if s is None or (server_role == "decode" and mode != "radix"):
        return {}
    buffer_only = s.host_memory_mode == "buffer_only"
    default_ratio = 1.2 if buffer_only else 2.0  # handle_hicache_ratio_default (arg_groups/hicache_hook.py)
    out: dict[str, Any] = ({"hicache_size_gb": float(s.size_gb)} if s.size_gb
                           else {"hicache_ratio": s.ratio or default_ratio})  # fmt: skip
    if buffer_only:
        out["hicache_host_memory_mode"] = "buffer_only"
    if mode == "radix":
        out["decode_radix_cache"] = True
    if s.write_policy is not None:
        out["hicache_write_policy"] = s.write_policy
    if s.storage is not None:
        out["hicache_storage_backend"] = s.storage.backend
        if s.storage.prefetch_policy is not None:
            out["hicache_prefetch_policy"] = s.storage.prefetch_policy
    return out
