"""What one worker costs per second, from the lease pricing of core/sizing/cost.py (the same Pool and
per-node/per-GPU conversion `inferctl plan cost` uses: a second formula would let the two disagree).

A worker is one SGLang server. inferctl runs one server per role on a node, or one server across
ceil(tp / GPUs per node) nodes when tp spans nodes; the role's lease is split evenly between its
servers, GPUs a server leaves unused included (they are paid for all the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infer_ctl.core.sizing.cost import Pool, node_hour_price


@dataclass(frozen=True)
class RolePrice:
    """The lease of one role's nodes: per node-hour or per GPU-hour (exactly one), GPUs per node, the
    number of nodes and the tp of each server (None: one server per node)."""

    role: str
    gpus_per_node: int
    nodes: int = 1
    tp: int | None = None
    node_hour_usd: float | None = None
    gpu_hour_usd: float | None = None


def servers(price: RolePrice) -> int:
    per_server_nodes = math.ceil((price.tp or price.gpus_per_node) / price.gpus_per_node)
    return max(1, price.nodes // per_server_nodes)


def worker_usd_per_s(price: RolePrice) -> float:
    """Dollars per second one worker (server) of the role costs."""
    node_hour = node_hour_price(gpus_per_node=price.gpus_per_node, node_hour_usd=price.node_hour_usd,
                                gpu_hour_usd=price.gpu_hour_usd)
    pool = Pool(price.role, nodes=price.nodes, gpus_per_node=price.gpus_per_node, node_hour_usd=node_hour,
                tp=price.tp or price.gpus_per_node)
    return pool.hourly_usd / servers(price) / 3600.0
