"""Profile contradictions that make a broken launch (issue 29), judged before anything starts.

Each passed `profile validate` and printed a plausible `launch --dry-run` before: a server command
without `--model-path`; `--tp-size 8` on a node declaring no GPUs (so no CUDA_VISIBLE_DEVICES); a
`collocated: true` profile whose PD roles and sections were silently dropped; an extra arg replacing a
setting launch allocates from (`--tp-size` against `models.target.tp`: GPUs, node groups and the
router's URLs follow the profile's value, the process the extra arg's). All are FAILs: launch refuses,
`profile validate` exits 64. Each finding names the field to change in `details["field"]`.
"""

from __future__ import annotations

from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang.argv import ArgOverride
from infer_ctl.core.sglang.instance import Instance
from infer_ctl.profile import Profile
from infer_ctl.profile.sglang import DecodeServer, ExtraArgs, PrefillServer

MODELS = "launch.models"
GPUS = "launch.gpus"
COLLOCATED = "launch.collocated"
OVERRIDE = "launch.override"
GPUS_UNEVEN = "launch.gpus_uneven"

#: extra args launch cannot follow: it sizes CUDA_VISIBLE_DEVICES and node groups from tp x dp, and the
#: router, `status` and `check servers` reach the server at the profile's host and port. Other overrides
#: (context length, memory fraction, ...) stay a WARN: the server still runs, just not as written.
ALLOCATING_FLAGS = frozenset(
    {"--tp-size", "--dp-size", "--model-path", "--host", "--port", "--nnodes", "--node-rank", "--dist-init-addr"}
)


def _node_index(profile: Profile, name: str) -> int:
    return next(i for i, n in enumerate(profile.nodes) if n.name == name)


def override_field(profile: Profile, inst: Instance, flag: str) -> str:
    """The profile field an extra arg's flag contradicts (where the user should change it instead)."""
    role = inst.role
    server = getattr(profile.sglang, role)
    if flag in ("--tp-size", "--dp-size"):
        key = flag[2:4]
        return f"sglang.{role}.{key}" if getattr(server, key) is not None or profile.models is None \
            else f"models.target.{key}"
    if flag == "--host":
        return f"sglang.{role}.host"
    if flag == "--port":
        port_key = "prefill_port" if role in ("prefill", "collocated") else "decode_port"
        return f"nodes[{_node_index(profile, inst.node)}].overrides.{port_key} or sglang.{role}.port"
    return {
        "--model-path": "models.target.path",
        "--context-length": "models.target.context_length",
        "--served-model-name": "models.target.served_name",
        "--tokenizer-path": "models.target.tokenizer_path",
        "--mem-fraction-static": "sglang.mem_fraction_static",
    }.get(flag, "the profile")


def override_finding(profile: Profile, inst: Instance, ov: ArgOverride, canonical: str) -> Finding:
    field = override_field(profile, inst, canonical)
    details = {"flag": ov.flag, "profile": ov.profile_value, "extra": ov.extra_value, "field": field,
               "source": ov.source}
    if canonical in ALLOCATING_FLAGS:
        return Finding.fail(
            OVERRIDE, inst.node, inst.name,
            f"{ov.message}; launch still allocates GPUs, nodes and the server's address from {field}, "
            "so the server would not run as placed",
            details=details, remedy=f"set {field} instead and drop {ov.flag} from {ov.source}",
        )  # fmt: skip
    return Finding.warn(
        OVERRIDE, inst.node, inst.name, ov.message, details=details,
        remedy=f"change {field} instead of {ov.source}, or drop the extra arg",
    )  # fmt: skip


def _models_findings(profile: Profile, chosen: list[Instance], args: dict[str, dict[str, str | None]]) -> list[Finding]:
    if profile.models is not None:
        return []
    missing = [i.name for i in chosen if i.is_leader and not args[i.name].get("--model-path")]
    if not missing:
        return []  # every server gets its model from extra args (already a WARN-free, deliberate choice)
    return [Finding.fail(
        MODELS, "-", "models",
        f"models: the profile has no models section, so {len(missing)} server(s) would start without "
        "--model-path and fail at once",
        details={"field": "models.target.path", "instances": missing},
        remedy="add `models: {target: {path: /models/NAME, tp: N}}` (the checkpoint directory on the nodes)",
    )]  # fmt: skip


def _device(args: dict[str, str | None]) -> str:
    return (args.get("--device") or "cuda").lower()


def _gpu_findings(profile: Profile, chosen: list[Instance], args: dict[str, dict[str, str | None]]) -> list[Finding]:
    """A node declaring `gpus: 0` runs its server with no CUDA_VISIBLE_DEVICES (instance.py treats it as
    a simulated node); a real launch there starts tp x dp CUDA ranks on whatever the node has, or none.
    Only an explicit non-CUDA `--device` (SGLang's CPU backend) makes that deliberate."""
    out: list[Finding] = []
    for inst in chosen:
        node = profile.node(inst.node)
        if node.gpus > 0 or _device(args[inst.name]) != "cuda":
            continue
        i = _node_index(profile, node.name)
        ranks = inst.tp * inst.dp // max(inst.nnodes, 1)
        out.append(Finding.fail(
            GPUS, inst.node, inst.name,
            f"nodes[{i}].gpus: 0, but its {inst.role} server runs tp {inst.tp} x dp {inst.dp} = "
            f"{inst.tp * inst.dp} GPU rank(s) ({ranks} here) with no CUDA_VISIBLE_DEVICES",
            details={"field": f"nodes[{i}].gpus", "gpus": 0, "tp": inst.tp, "dp": inst.dp},
            remedy=f"set nodes[{i}].gpus to the node's GPU count (at least {ranks}), or run a CPU server "
            f"with --device cpu in sglang.extra_args.{inst.role}",
        ))  # fmt: skip
    return out


def _uneven_gpu_findings(profile: Profile, chosen: list[Instance]) -> list[Finding]:
    """Launch sizes a role's servers for its smallest node (instance.py `_nodes_per_instance`): one node with
    fewer GPUs than tp x dp makes every server of the role span several nodes, tp over the network, with
    GPUs idle on each larger node. A WARN naming that node: it runs, at a fraction of what was written."""
    out: list[Finding] = []
    for role in ("prefill", "decode", "collocated"):
        members = [i for i in chosen if i.role == role]
        if not members:
            continue
        nodes = [n for n in profile.nodes if profile.collocated or n.has_role(role)]  # as instance.py groups
        counts = [n.gpus for n in nodes if n.gpus > 0]
        if len(set(counts)) < 2:
            continue
        nnodes = members[0].nnodes
        smallest = min(counts)
        ranks = members[0].tp * members[0].dp
        if nnodes == 1 or -(-ranks // max(counts)) >= nnodes:
            continue  # the largest nodes would be grouped the same way: nothing lost to the small one
        for i, node in enumerate(profile.nodes):
            if node.name in {n.name for n in nodes} and node.gpus == smallest:
                per = ranks // nnodes
                out.append(Finding.warn(
                    GPUS_UNEVEN, node.name, role,
                    f"nodes[{i}].gpus: {smallest}, fewer than the other {role} nodes' {max(counts)}: launch sizes "
                    f"every {role} server for {smallest} GPUs per node, so each of tp {members[0].tp} x dp "
                    f"{members[0].dp} spans {nnodes} nodes ({per} ranks per node, tp over the network) and "
                    f"leaves {max(counts) - per} GPUs idle on each {max(counts)}-GPU node",
                    details={"field": f"nodes[{i}].gpus", "gpus": smallest, "largest": max(counts),
                             "nnodes": nnodes},
                    remedy=f"correct nodes[{i}].gpus if the node has more, or take it out of the {role} pool "
                    f"(or lower sglang.{role}.tp to {smallest})",
                ))  # fmt: skip
    return out


def _pd_settings_set(profile: Profile) -> list[str]:
    """PD-only settings that differ from their defaults: collocated servers never read them."""
    sg = profile.sglang
    found = [f"sglang.{role}" for role, default in (("prefill", PrefillServer()), ("decode", DecodeServer()))
             if getattr(sg, role) != default]
    found += [f"sglang.extra_args.{role}" for role in ("prefill", "decode")
              if getattr(sg.extra_args, role) != getattr(ExtraArgs(), role)]
    for i, node in enumerate(profile.nodes):
        found += [f"nodes[{i}].overrides.{key}" for key in ("decode_port", "bootstrap_port")
                  if getattr(node.overrides, key) is not None]
    return found


def _collocated_findings(profile: Profile) -> list[Finding]:
    """`collocated: true` runs one plain server per node whatever the roles say. Every node needs a role
    (a collocated node lists prefill, decode or both, and that is fine); a profile splitting its nodes
    into prefill-only and decode-only ones, or configuring the PD servers, describes PD, not this."""
    if not profile.collocated:
        return []
    out: list[Finding] = []
    split = {r: [i for i, n in enumerate(profile.nodes) if [x.value for x in n.roles] == [r]] for r in ("prefill", "decode")}
    if split["prefill"] and split["decode"]:
        out.append(Finding.fail(
            COLLOCATED, "-", "collocated",
            f"collocated: true, but nodes {', '.join(f'nodes[{i}]' for i in split['prefill'])} are prefill-only "
            f"and {', '.join(f'nodes[{i}]' for i in split['decode'])} decode-only: every node would run one plain "
            f"server ({len(profile.nodes)} in all), no PD disaggregation",
            details={"field": "collocated", "prefill_only": split["prefill"], "decode_only": split["decode"]},
            remedy="drop `collocated: true` for PD disaggregation, or give every node roles [prefill, decode] "
            "for plain servers",
        ))  # fmt: skip
    for field in _pd_settings_set(profile):
        out.append(Finding.fail(
            COLLOCATED, "-", field,
            f"{field} is set, but collocated: true ignores it (collocated servers read sglang.collocated, "
            "sglang.extra_args.collocated and nodes[].overrides.prefill_port)",
            details={"field": field},
            remedy=f"move the setting to the collocated equivalent and remove {field}, or drop `collocated: true`",
        ))  # fmt: skip
    return out


def contradiction_findings(
    profile: Profile, chosen: list[Instance], args: dict[str, dict[str, str | None]]
) -> list[Finding]:
    """FAILs for a profile whose launch would be broken (`args`: effective flags by instance name); the
    extra-arg overrides are judged one by one where the caller renders them (override_finding)."""
    return [*_models_findings(profile, chosen, args), *_gpu_findings(profile, chosen, args),
            *_uneven_gpu_findings(profile, chosen), *_collocated_findings(profile)]
