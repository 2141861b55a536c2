"""Which SGLang server processes a profile describes, where they run and what they own.

An `Instance` is ONE server process on ONE node. A logical server whose tp*dp spans several nodes is
several instances (node ranks 0..n-1) sharing a `group`; only rank 0 serves HTTP. Everything the
renderers need (ports, GPUs, paths) is resolved here once, so argv, env file and unit agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infer_ctl.errors import ProfileError, UsageError
from infer_ctl.profile import Node, Profile, Role
from infer_ctl.profile.sglang import CollocatedServer, DecodeServer, PrefillServer

ROLES = ("prefill", "decode", "collocated")
#: SGLang's --engine-info-bootstrap-port default; it must differ per instance on one node
ENGINE_INFO_PORT = 6789


@dataclass(frozen=True)
class Instance:
    name: str  # "<node>-<role>", unique in the profile
    node: str
    #: the node's address (SSH target, and what decodes/the router use to reach this server)
    host: str
    role: str  # "prefill" | "decode" | "collocated"
    #: the address the HTTP server (and a prefill's bootstrap server) binds
    bind_host: str
    port: int
    #: the prefill's bootstrap server port; on a decode, the port it assumes when a request says null
    bootstrap_port: int | None
    #: physical GPU indexes this process uses (CUDA_VISIBLE_DEVICES); empty: the node declares none
    gpus: tuple[int, ...]
    tp: int
    dp: int
    nnodes: int = 1
    node_rank: int = 0
    #: name of the rank-0 instance of this server (itself when nnodes == 1)
    group: str = ""
    dist_init_addr: str | None = None
    #: set only when several instances share a node (SGLang's default 6789 would collide)
    engine_info_port: int | None = None
    config_dir: str = "/etc/inferctl"
    log_dir: str = "/var/log/inferctl"

    @property
    def is_leader(self) -> bool:
        """Only node rank 0 serves HTTP (/health, /server_info, /generate)."""
        return self.node_rank == 0

    @property
    def url(self) -> str:
        host = self.host if self.bind_host in ("0.0.0.0", "::") else self.bind_host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"


def _server(profile: Profile, role: str) -> PrefillServer | DecodeServer | CollocatedServer:
    server: PrefillServer | DecodeServer | CollocatedServer = getattr(profile.sglang, role)
    return server


def role_parallelism(profile: Profile, role: str) -> tuple[int, int]:
    """(tp, dp) of a role: the role's own setting, else the target model's, else 1."""
    server = _server(profile, role)
    target = profile.models.target if profile.models else None
    tp = server.tp or (target.tp if target else 1)
    dp = server.dp or (target.dp if target else 1)
    return tp, dp


def _port(profile: Profile, node: Node, role: str) -> int:
    ports = profile.server_ports(node)
    return ports[role]


def _roles_of(profile: Profile, node: Node) -> list[str]:
    if profile.collocated:
        return ["collocated"]
    return [r.value for r in (Role.PREFILL, Role.DECODE) if node.has_role(r)]


def _nodes_per_instance(profile: Profile, role: str, nodes: list[Node]) -> int:
    tp, dp = role_parallelism(profile, role)
    gpus = min((n.gpus for n in nodes), default=0)
    if gpus <= 0:  # nodes that declare no GPUs (simulated): one process per node
        return 1
    n = math.ceil(tp * dp / gpus)
    if n > 1 and (tp * dp) % n:
        raise ProfileError(
            f"models.target: tp*dp = {tp * dp} cannot be split evenly over {n} {role} nodes of {gpus} GPUs",
            remedy="choose tp*dp as a multiple of the GPUs per node, or set sglang.<role>.tp/dp",
        )
    if len(nodes) % n:
        raise ProfileError(
            f"nodes: {len(nodes)} {role} node(s) cannot be grouped into servers of {n} nodes "
            f"(tp*dp = {tp * dp}, {gpus} GPUs per node)",
            remedy=f"use a multiple of {n} {role} nodes, or lower tp/dp for the {role} role",
        )
    return n


def instances(profile: Profile) -> list[Instance]:
    """Every server process of the profile, in node order (prefill before decode on a shared node)."""
    roles_by_node = {n.name: _roles_of(profile, n) for n in profile.nodes}
    result: list[Instance] = []
    # GPUs already taken on a node by an earlier role (a node with both roles splits its GPUs).
    gpu_offset: dict[str, int] = {n.name: 0 for n in profile.nodes}
    for role in ROLES:
        nodes = [n for n in profile.nodes if role in roles_by_node[n.name]]
        if not nodes:
            continue
        per = _nodes_per_instance(profile, role, nodes)
        tp, dp = role_parallelism(profile, role)
        server = _server(profile, role)
        for start in range(0, len(nodes), per):
            group_nodes = nodes[start : start + per]
            leader = group_nodes[0]
            group = f"{leader.name}-{role}"
            dist = None
            if per > 1:
                port = profile.sglang.dist_init_port + (1 if role == "decode" else 0)
                dist = f"{_bracket(leader.host)}:{port}"
            for rank, node in enumerate(group_nodes):
                result.append(
                    _instance(profile, node, role, server, tp, dp, per, rank, group, dist, gpu_offset)
                )
    order = {n.name: i for i, n in enumerate(profile.nodes)}
    result.sort(key=lambda i: (order[i.node], ROLES.index(i.role)))
    return result


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _instance(
    profile: Profile,
    node: Node,
    role: str,
    server: PrefillServer | DecodeServer | CollocatedServer,
    tp: int,
    dp: int,
    nnodes: int,
    rank: int,
    group: str,
    dist: str | None,
    gpu_offset: dict[str, int],
) -> Instance:
    per_process = (tp * dp) // nnodes
    gpus: tuple[int, ...] = ()
    if node.gpus > 0:
        first = gpu_offset[node.name]
        if first + per_process > node.gpus:
            raise ProfileError(
                f"nodes[{profile.nodes.index(node)}]: {node.name} has {node.gpus} GPUs but its "
                f"{' and '.join(_roles_of(profile, node))} servers need {first + per_process}",
                remedy="give each role its own node, or lower sglang.<role>.tp/dp so both fit",
            )
        gpus = tuple(range(first, first + per_process))
        gpu_offset[node.name] = first + per_process
    shared = len(_roles_of(profile, node)) > 1
    bootstrap = (
        profile.server_ports(node)["bootstrap"]
        if role == "prefill"
        else (profile.sglang.prefill.bootstrap_port if role == "decode" else None)
    )
    return Instance(
        name=f"{node.name}-{role}",
        node=node.name,
        host=node.host,
        role=role,
        bind_host=server.host or node.host,
        port=_port(profile, node, role),
        bootstrap_port=bootstrap,
        gpus=gpus,
        tp=tp,
        dp=dp,
        nnodes=nnodes,
        node_rank=rank,
        group=group,
        dist_init_addr=dist,
        engine_info_port=(ENGINE_INFO_PORT + ROLES.index(role)) if shared else None,
        # `{node}` in these paths keeps nodes apart where they share a filesystem (NFS homes, the harness)
        config_dir=profile.sglang.lifecycle.config_dir.replace("{node}", node.name),
        log_dir=profile.sglang.log_dir.replace("{node}", node.name),
    )


def find_instance(profile: Profile, name: str) -> Instance:
    """An instance by its name, or by a node name that runs exactly one instance."""
    every = instances(profile)
    for inst in every:
        if inst.name == name:
            return inst
    on_node = [i for i in every if i.node == name]
    if len(on_node) == 1:
        return on_node[0]
    known = ", ".join(i.name for i in every)
    raise UsageError(
        f"no SGLang instance named {name!r} in profile {profile.name}", remedy=f"choose one of: {known}"
    )
