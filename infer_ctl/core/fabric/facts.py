"""What inferctl knows about one node's RDMA fabric, whichever tool it came from.

Pure data: the commands and parsers in infer_ctl/facts/ (rdma_sysfs, ibv_devinfo, rdma_link, qos,
rdma_pingpong, show_gids) produce these types, the rules in core/fabric/rules.py and the pair judge in
core/fabric/judge.py read them. `NodeFabricFacts` is the bundle of one node, as the rules see it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


# ---- sysfs (/sys/class/infiniband, /sys/class/net) -----------------------------------------------
@dataclass(frozen=True)
class GidEntry:
    index: int
    gid: str
    #: "RoCE v2", "IB/RoCE v1", or None when the kernel exposes no type
    type: str | None = None
    ndev: str | None = None


@dataclass
class RdmaPort:
    device: str
    port: int
    state: str | None = None  # "ACTIVE" from "4: ACTIVE"
    phys_state: str | None = None  # "LinkUp" from "5: LinkUp"
    rate_gbps: float | None = None
    rate_text: str | None = None
    link_layer: str | None = None  # "Ethernet" | "InfiniBand"
    gids: list[GidEntry] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)  # counters/ and hw_counters/ merged

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"


@dataclass
class RdmaDevice:
    name: str
    ports: dict[int, RdmaPort] = field(default_factory=dict)
    netdevs: list[str] = field(default_factory=list)
    fw_ver: str | None = None
    hca_type: str | None = None


@dataclass
class NetdevSysfs:
    name: str
    mtu: int | None = None
    operstate: str | None = None
    #: MLNX_OFED `qos/trust` ("dscp" | "pcp"); None on upstream drivers
    trust: str | None = None
    #: ECN per priority, from MLNX_OFED `ecn/roce_np|roce_rp/enable/<prio>`; empty when not exposed
    ecn_np: dict[int, bool] = field(default_factory=dict)
    ecn_rp: dict[int, bool] = field(default_factory=dict)
    cnp_dscp: int | None = None
    cnp_802p_prio: int | None = None


@dataclass
class SysfsSnapshot:
    ib_present: bool = False
    devices: dict[str, RdmaDevice] = field(default_factory=dict)
    netdevs: dict[str, NetdevSysfs] = field(default_factory=dict)
    missing_netdevs: list[str] = field(default_factory=list)
    tools: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NicPcie:
    """The PCIe link of an RDMA NIC (sysfs `device/current_link_*`, `max_link_*`)."""

    width: int | None = None
    max_width: int | None = None
    #: GT/s per lane: 2.5, 5, 8, 16, 32, 64 (Gen1..Gen6)
    speed_gts: float | None = None
    max_speed_gts: float | None = None
    speed_text: str | None = None


# ---- ibv_devinfo -v ------------------------------------------------------------------------------
@dataclass
class DevinfoPort:
    port: int
    state: str | None = None  # "PORT_ACTIVE"
    max_mtu: int | None = None
    active_mtu: int | None = None
    link_layer: str | None = None
    active_width: str | None = None  # "4X"
    active_speed: str | None = None  # "25.0 Gbps"
    phys_state: str | None = None  # "LINK_UP"
    gids: list[GidEntry] = field(default_factory=list)


@dataclass
class DevinfoDevice:
    name: str
    transport: str | None = None
    fw_ver: str | None = None
    vendor_part_id: str | None = None
    ports: dict[int, DevinfoPort] = field(default_factory=dict)


@dataclass(frozen=True)
class DevinfoError:
    """Why no device list came back, in words a user can act on."""

    kind: str  # "not-installed" | "no-devices" | "failed"
    message: str


# ---- rdma link show ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RdmaLink:
    device: str
    port: int
    state: str | None
    physical_state: str | None
    netdev: str | None


# ---- show_gids -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShowGidsRow:
    device: str
    port: int
    entry: GidEntry
    ipv4: str | None


# ---- QoS (mlnx_qos / dcb, ethtool -a, ethtool -S) ------------------------------------------------
@dataclass
class QosFacts:
    #: which tool the facts came from: "mlnx_qos" | "dcb"
    source: str
    #: PFC enabled per priority 0..7 (None when the tool did not show it)
    pfc: list[bool] | None = None
    #: "dscp" | "pcp"; None when the tool shows no trust state (mlnx_qos prints "none" after "Priority
    #: trust state is not supported on your system", and old mlnx-tools print no trust line at all)
    trust: str | None = None
    dcbx_mode: str | None = None
    #: DSCP -> priority, when shown (mlnx_qos dscp2prio, dcb app dscp-prio)
    dscp2prio: dict[int, int] = field(default_factory=dict)

    @property
    def pfc_priorities(self) -> list[int]:
        return [i for i, on in enumerate(self.pfc or []) if on]


@dataclass(frozen=True)
class PauseFacts:
    autoneg: bool | None
    rx: bool
    tx: bool


#: the mlx5 per-priority PFC pause frame counters of `ethtool -S` (`rx_prio3_pause`, `tx_prio3_pause`)
PRIO_PAUSE_COUNTER = re.compile(r"^(rx|tx)_prio([0-7])_pause$")


def pause_priority(counter: str) -> int | None:
    """The priority a per-priority pause counter counts (`rx_prio3_pause` -> 3); None for other names."""
    m = PRIO_PAUSE_COUNTER.match(counter)
    return int(m.group(2)) if m else None


# ---- pair-test outputs (ibv_rc_pingpong, perftest) -----------------------------------------------
@dataclass
class RcPingPongOutput:
    local_gid: str | None = None
    remote_gid: str | None = None
    bytes: int | None = None
    mbit_per_s: float | None = None
    iters: int | None = None
    usec_per_iter: float | None = None
    errors: list[str] = field(default_factory=list)
    #: a "remote address" line was printed: the TCP exchange of the QP numbers finished
    exchanged: bool = False


@dataclass(frozen=True)
class PerftestLatRow:
    bytes: int
    iterations: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float | None = None
    t_stdev: float | None = None
    p99: float | None = None
    p999: float | None = None


@dataclass(frozen=True)
class PerftestBwRow:
    bytes: int
    iterations: int
    bw_peak: float
    bw_average: float
    msg_rate_mpps: float
    #: "Gb/sec" (--report_gbits), "MiB/sec" or "MB/sec" as printed in the header
    unit: str

    @property
    def bw_average_gbps(self) -> float:
        if self.unit.startswith("Gb"):
            return self.bw_average
        return self.bw_average * 2**20 * 8 / 1e9


@dataclass
class PerftestOutput:
    test: str | None = None  # "RDMA_Write Latency Test"
    device: str | None = None
    link_type: str | None = None
    gid_index: int | None = None
    mtu: int | None = None
    lat: list[PerftestLatRow] = field(default_factory=list)
    bw: list[PerftestBwRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: a "remote address" line was printed: the TCP exchange of the QP numbers finished
    exchanged: bool = False


#: one end's parsed output of a pair test, whichever tool ran
PairOutput = RcPingPongOutput | PerftestOutput


# ---- the bundle of one node ----------------------------------------------------------------------
@dataclass
class NetdevFacts:
    name: str
    sysfs: NetdevSysfs | None = None
    qos: QosFacts | None = None
    #: why PFC/trust could not be read (e.g. neither mlnx_qos nor dcb installed)
    qos_error: str | None = None
    #: trust from `dcb apptrust` / the DSCP APP table, when mlnx_qos is absent
    dcb_trust: str | None = None
    pause: PauseFacts | None = None
    pause_error: str | None = None
    #: growth of `ethtool -S` rx/tx_prio<N>_pause between the two samples; None when not sampled
    pause_deltas: dict[str, int] | None = None
    pause_counters_error: str | None = None
    pause_interval_s: float = 0.0

    @property
    def trust(self) -> str | None:
        if self.sysfs and self.sysfs.trust:
            return self.sysfs.trust
        if self.qos and self.qos.trust:
            return self.qos.trust
        return self.dcb_trust


@dataclass
class NodeFabricFacts:
    node: str
    sysfs: SysfsSnapshot | None = None
    sysfs_error: str | None = None
    devinfo: list[DevinfoDevice] | None = None
    devinfo_error: DevinfoError | None = None
    netdevs: dict[str, NetdevFacts] = field(default_factory=dict)
    #: per "dev/port": counters that grew between the two samples; None when not sampled twice
    counter_deltas: dict[str, dict[str, int]] | None = None
    counter_interval_s: float = 0.0
    #: `rdma link show`, read only when sysfs shows no device but ibv_devinfo does (e.g. containers)
    links: list[RdmaLink] | None = None
    #: per RDMA device, its NIC's PCIe link; None when not read
    nic_pcie: dict[str, NicPcie] | None = None

    def device_names(self) -> list[str]:
        names: list[str] = []
        if self.sysfs:
            names += list(self.sysfs.devices)
        for d in self.devinfo or []:
            if d.name not in names:
                names.append(d.name)
        return names

    def sysfs_ports(self, device: str) -> list[RdmaPort]:
        if self.sysfs and device in self.sysfs.devices:
            return [p for _, p in sorted(self.sysfs.devices[device].ports.items())]
        return []

    def netdevs_of(self, device: str) -> list[str]:
        from_links = [lk.netdev for lk in self.links or [] if lk.device == device and lk.netdev]
        if from_links:
            return from_links
        if self.sysfs and device in self.sysfs.devices:
            found = list(self.sysfs.devices[device].netdevs)
            if found:
                return found
            for p in self.sysfs.devices[device].ports.values():
                for g in p.gids:
                    if g.ndev and g.ndev not in found:
                        found.append(g.ndev)
            return found
        return []
