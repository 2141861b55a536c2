"""The bundle of fabric facts gathered from one node, as the rules see it."""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.facts.ibv_devinfo import DevinfoDevice, DevinfoError, DevinfoPort
from infer_ctl.facts.qos import PauseFacts, QosFacts
from infer_ctl.facts.rdma_link import RdmaLink
from infer_ctl.facts.rdma_sysfs import NetdevSysfs, RdmaPort, SysfsSnapshot


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

    def devinfo_port(self, device: str, port: int) -> DevinfoPort | None:
        for d in self.devinfo or []:
            if d.name == device:
                return d.ports.get(port)
        return None

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
