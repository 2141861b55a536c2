"""RDMA fabric expectations: RoCE QoS (PFC/ECN/trust), MTU, ping-pong thresholds."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from infer_ctl.profile.base import Port, StrictModel
from infer_ctl.profile.fabric_diag import GdrSettings, NcclSettings


class PingPongSettings(StrictModel):
    #: prefill-decode: every prefill node against every decode node (the KV paths); mesh: all pairs
    pairs: Literal["prefill-decode", "mesh", "explicit"] = "prefill-decode"
    explicit_pairs: list[tuple[str, str]] = Field(default_factory=list)
    max_rtt_us: Annotated[float, Field(gt=0)] = 6.0
    size: Annotated[int, Field(ge=1)] = 4096
    iters: Annotated[int, Field(ge=1)] = 1000
    #: minimum ib_write_bw result as a fraction of the link rate
    min_bw_fraction: Annotated[float, Field(gt=0, le=1)] = 0.8
    base_port: Port = 18515
    timeout_s: Annotated[float, Field(gt=0)] = 30.0
    perftest: bool = True
    bandwidth: bool = False


class FabricPolicy(StrictModel):
    pfc_priority: Annotated[int, Field(ge=0, le=7)] = 3
    trust: Literal["dscp", "pcp"] = "dscp"
    ecn: bool = True
    #: RoCE active MTU expected on the HCA ports (256..4096)
    mtu: Literal[256, 512, 1024, 2048, 4096] = 4096
    #: MTU expected on the netdev behind each HCA (None: at least active MTU + headers)
    netdev_mtu: Annotated[int, Field(ge=576, le=9216)] | None = None
    #: expected port rate in Gb/s (e.g. 400); None accepts any rate but reports it
    rate_gbps: Annotated[float, Field(gt=0)] | None = None
    link_layer: Literal["Ethernet", "InfiniBand"] = "Ethernet"
    #: GID address family to prefer when choosing the RoCE GID index (perftest's `--ipv6` for ipv6);
    #: also the family a fleet split evenly between IPv4 and IPv6 GIDs is expected to use
    gid_family: Literal["ipv4", "ipv6"] = "ipv4"
    #: let `provision` configure trust/PFC/ECN with mlnx_qos or dcb
    apply_qos: bool = False
    #: PCIe lanes / GT/s the platform gives the RDMA NICs; None: each NIC's own maximum (a platform
    #: that wires x8 or a Gen4 slot for a Gen5 NIC sets these so the check judges against the slot)
    nic_pcie_width: Annotated[int, Field(ge=1, le=32)] | None = None
    nic_pcie_speed_gts: Annotated[float, Field(gt=0)] | None = None
    #: seconds between the two samples of error counters
    counter_interval_s: Annotated[float, Field(ge=0)] = 2.0
    #: a link that went down more than once within this many hours is flapping (fabric.link_flaps, aznhc's 6 h)
    flap_window_h: Annotated[float, Field(gt=0, le=720)] = 6.0
    pingpong: PingPongSettings = Field(default_factory=PingPongSettings)
    #: active diagnostics, run only when asked (`check fabric --gdr` / `--nccl`)
    gdr: GdrSettings = Field(default_factory=GdrSettings)
    nccl: NcclSettings = Field(default_factory=NcclSettings)
