"""Nodes of the cluster and their per-node overrides."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from infer_ctl.profile.base import Port, StrictModel

NodeName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
#: a DNS name or ~/.ssh/config alias, an IPv4 address, or an IPv6 address (bare, optionally with a %zone):
#: never `user@host`, `host:port`, brackets or blanks, which would reach the resolver as part of the name
#: (the login and port have their own fields)
NodeHost = Annotated[str, Field(pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.-]*|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f.]*(%[A-Za-z0-9_.-]+)?)$")]


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class RdmaConfig(StrictModel):
    #: HCA names as in /sys/class/infiniband (passed to --disaggregation-ib-device)
    devices: list[str] = Field(default_factory=list)
    netdev: str | None = None
    #: RoCE GID index; None means "choose it like perftest does" from the GID table
    gid_index: Annotated[int, Field(ge=0)] | None = None
    #: per-GPU device map for --disaggregation-ib-device, e.g. {"0": "mlx5_0", "1": "mlx5_1"}
    device_map: dict[str, str] | None = None


class NodeOverrides(StrictModel):
    """Per-node deviations from the fleet-wide sections. `gpu` and `fabric` take any key of those
    sections and are validated against them (errors name `nodes[i].overrides.gpu.<key>`)."""

    gpu: dict[str, Any] = Field(default_factory=dict)
    fabric: dict[str, Any] = Field(default_factory=dict)
    prefill_port: Port | None = None
    decode_port: Port | None = None
    bootstrap_port: Port | None = None
    extra_args: list[str] = Field(default_factory=list)


class Node(StrictModel):
    name: NodeName
    host: NodeHost
    #: SSH port; defaults to ssh.port
    port: Port | None = None
    user: str | None = None
    connection: Literal["ssh", "local"] = "ssh"
    roles: Annotated[list[Role], Field(min_length=1)]
    gpus: Annotated[int, Field(ge=0, le=64)] = 8
    rdma: RdmaConfig | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    #: nodes with the same value reach each other over NVLink (one node, or an NVL72-class rack): the router
    #: prefers a decode in its prefill's domain, whose KV transfer then does not cross the NICs
    #: (docs/router.md, "Decode chosen by capacity"). None: not NVLink-connected to any other server
    nvlink_domain: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    overrides: NodeOverrides = Field(default_factory=NodeOverrides)

    def has_role(self, role: Role | str) -> bool:
        return Role(role) in self.roles
