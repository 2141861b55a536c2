"""A commented first profile from a few facts (`inferctl profile init`, issue 29 item 8).

A new user's alternative was to copy the reference profile (10.0.0.x behind bastion.example.net) and
delete what did not apply. The starter holds only what their cluster has, with every other section as a
comment naming the key and where it is documented, and it is parsed by the same loader as any profile
before anyone sees it: `init` never writes a file that `profile validate` refuses."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infer_ctl.errors import UsageError

#: a name or host as the nodes section takes it (profile/nodes.py NodeName); anything else is quoted
_PLAIN = re.compile(r"^[A-Za-z0-9/][A-Za-z0-9._:/-]*$")
_PREFIX = {"prefill": "pf", "decode": "dc", "mixed": "node"}


@dataclass(frozen=True)
class StarterNode:
    name: str
    host: str
    role: str  # prefill, decode or mixed (both roles in one collocated server)


@dataclass(frozen=True)
class Starter:
    name: str
    nodes: list[StarterNode]
    gpus: int = 8
    model: str = "/models/Llama-3.1-8B-Instruct"
    tp: int | None = None
    user: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def collocated(self) -> bool:
        return any(n.role == "mixed" for n in self.nodes)


def parse_nodes(role: str, specs: list[str], start: int = 1) -> list[StarterNode]:
    """`NAME=HOST` or `HOST` (named pf-01, dc-01, node-01, ... in order)."""
    nodes = []
    for i, spec in enumerate(specs, start):
        name, sep, host = spec.partition("=")
        if not sep:
            name, host = f"{_PREFIX[role]}-{i:02d}", spec
        if not name or not host:
            raise UsageError(f"--{role} {spec!r}: give NAME=HOST or HOST", remedy=f"e.g. --{role} {_PREFIX[role]}-01=10.0.0.11")
        nodes.append(StarterNode(name.strip(), host.strip(), role))
    return nodes


def check_roles(nodes: list[StarterNode]) -> None:
    """The shapes a profile can describe: prefill + decode (disaggregated) or mixed (collocated)."""
    roles = {n.role for n in nodes}
    if not nodes:
        raise UsageError("no nodes given", remedy="e.g. --prefill pf-01=10.0.0.11 --decode dc-01=10.0.0.21, "
                         "or --mixed box-01=10.0.1.5 for one collocated server")
    if "mixed" in roles and roles != {"mixed"}:
        raise UsageError("--mixed (collocated servers) cannot be combined with --prefill/--decode",
                         remedy="a profile is either disaggregated (prefill + decode) or collocated")
    if "mixed" not in roles and roles != {"prefill", "decode"}:
        missing = ({"prefill", "decode"} - roles).pop()
        raise UsageError(f"a disaggregated cluster needs both roles: no --{missing} node given",
                         remedy=f"add --{missing} NAME=HOST, or use --mixed for collocated servers")


def _q(text: str) -> str:
    return text if _PLAIN.match(text) else '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(starter: Starter) -> str:
    """The profile text: YAML with comments; parse it with `profile.load.parse_profile_text`."""
    check_roles(starter.nodes)
    tp = starter.tp or max(starter.gpus, 1)
    roles = {"prefill": "[prefill]", "decode": "[decode]", "mixed": "[prefill, decode]"}
    out = [
        "# inferctl cluster profile, written by `inferctl profile init`.",
        "# Check it:        inferctl profile validate -p THIS_FILE",
        "# Every default:   inferctl profile show -p THIS_FILE",
        "# A full example:  profiles/reference-h100-h200.yaml (RDMA, EAGLE3, named prefixes)",
        f"name: {_q(starter.name)}",
    ]
    if starter.collocated:
        out += ["# one plain SGLang server per node (prefill and decode in the same process)", "collocated: true"]
    out += [
        "ssh:",
        f"  user: {_q(starter.user)}" if starter.user else "  # user: ubuntu          # the login on every node (default: yours)",
        "  host_key_policy: reject  # first contact: inferctl nodes --accept-new-host-keys",
        "  # jump_host: bastion.example.net:22",
        "nodes:",
        "  # gpus: the node's GPUs (0: none); add rdma: {devices: [mlx5_0], netdev: ens1f0np0} for RoCE/IB",
    ]
    out += [
        f"  - {{name: {_q(n.name)}, host: {_q(n.host)}, roles: {roles[n.role]}, gpus: {starter.gpus}}}"
        for n in starter.nodes
    ]
    out += [
        "models:",
        "  # tp: GPUs per server; a model preset (inferctl plan kv --list-presets) sizes plan and sim",
        f"  target: {{path: {_q(starter.model)}, tp: {tp}}}",
        "  # draft: {path: /models/EAGLE3-..., algorithm: EAGLE3, num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}",
        "sglang:",
        "  version: 0.5.23",
    ]
    if starter.collocated:
        out += ["  collocated: {port: 30000}"]
    else:
        out += [
            "  transfer_backend: mooncake  # the KV transfer between prefill and decode",
            "  prefill: {port: 30000, bootstrap_port: 8998}",
            "  decode: {port: 30001}",
        ]
    if starter.gpus == 0:
        # a server with no GPU must be told so: SGLang defaults to CUDA, and validate refuses a GPU-less node
        # whose server would run GPU ranks (launch.gpus)
        keys = ["collocated"] if starter.collocated else ["prefill", "decode"]
        out += ["  # no GPUs (--gpus 0): SGLang's CPU backend; add anything else SGLang takes, per role",
                "  extra_args: {" + ", ".join(f"{k}: [--device, cpu]" for k in keys) + "}"]
    else:
        out += ["  # extra_args: {prefill: [], decode: []}   # anything else SGLang takes, per role"]
    out += [
        "# gpu: {max_temp_c: 85}                     # health thresholds of check gpu / audit",
        "# fabric: {pfc_priority: 3, trust: dscp, ecn: true, mtu: 4096}   # RoCE settings check fabric expects",
        "router:",
        "  listen: 127.0.0.1:8000",
        "  policy: cache_aware",
        "  # prefixes: [{name: support-bot-v1, file: prompts/system.txt, ttl_s: 3600, replicas: 2, pin: true}]",
    ]
    return "\n".join(out) + "\n"
