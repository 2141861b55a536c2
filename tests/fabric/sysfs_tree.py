"""Build sysfs-shaped directory trees for the fabric gatherer (the INFERCTL_SYSFS_ROOT test seam).

The layout mirrors the kernel's (drivers/infiniband/core/sysfs.c, mlx5 en_sysfs.c): file contents
use the kernel's formats ("4: ACTIVE", "400 Gb/sec (4X NDR)", GIDs in full %pI6 form). What is not
real: these are plain files, so an empty GID slot is a zero GID file instead of EINVAL on read.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path


def full_gid(text: str) -> str:
    """'::ffff:10.0.0.11' -> '0000:0000:0000:0000:0000:ffff:0a00:000b' (how sysfs prints GIDs)."""
    return ipaddress.IPv6Address(text).exploded


@dataclass
class Hca:
    name: str = "mlx5_0"
    netdev: str = "ens1f0np0"
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "Ethernet"
    #: (index, gid in any IPv6 notation, type); mlx5 layout by default
    gids: list[tuple[int, str, str]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=lambda: {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0})
    hw_counters: dict[str, int] = field(default_factory=lambda: {"out_of_sequence": 0, "packet_seq_err": 0, "np_cnp_sent": 0})
    #: the NIC's PCI function files (drivers/pci/pci-sysfs.c formats): current/max link width and speed;
    #: a ConnectX-7 at Gen5 x16 by default
    pcie: dict[str, str] | None = field(default_factory=lambda: {
        "current_link_width": "16", "max_link_width": "16",
        "current_link_speed": "32.0 GT/s PCIe", "max_link_speed": "32.0 GT/s PCIe"})


def mlx5_gids(ipv4: str = "10.0.0.11", mac_suffix: str = "0ac0:ebff:fef0:28b2") -> list[tuple[int, str, str]]:
    ll = f"fe80::{mac_suffix}"
    return [(0, ll, "IB/RoCE v1"), (1, ll, "RoCE v2"), (2, f"::ffff:{ipv4}", "IB/RoCE v1"), (3, f"::ffff:{ipv4}", "RoCE v2")]


@dataclass
class Netdev:
    name: str = "ens1f0np0"
    mtu: int = 9000
    operstate: str = "up"
    trust: str | None = "dscp"  # MLNX_OFED qos/trust; None = upstream driver (no file)
    ecn_np: dict[int, int] | None = field(default_factory=lambda: {p: int(p == 3) for p in range(8)})
    ecn_rp: dict[int, int] | None = field(default_factory=lambda: {p: int(p == 3) for p in range(8)})


def _w(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")


def build(root: Path, hcas: list[Hca], netdevs: list[Netdev]) -> Path:
    for h in hcas:
        dev = root / "class" / "infiniband" / h.name
        _w(dev / "fw_ver", "28.39.1002")
        _w(dev / "node_type", "1: CA")
        (dev / "device" / "net" / h.netdev).mkdir(parents=True, exist_ok=True)
        for name, value in (h.pcie or {}).items():
            _w(dev / "device" / name, value)
        port = dev / "ports" / "1"
        _w(port / "state", h.state)
        _w(port / "phys_state", h.phys_state)
        _w(port / "rate", h.rate)
        _w(port / "link_layer", h.link_layer)
        gids = h.gids if h.gids else (mlx5_gids() if h.link_layer == "Ethernet" else [(0, "fe80::248a:703:49:d4f0", "")])
        for index, gid, gid_type in gids:
            _w(port / "gids" / str(index), full_gid(gid))
            if gid_type:
                _w(port / "gid_attrs" / "types" / str(index), gid_type)
                _w(port / "gid_attrs" / "ndevs" / str(index), h.netdev)
        _w(port / "gids" / str(len(gids)), full_gid("::"))  # an empty slot reads as the zero GID
        set_counters(root, h)
    for n in netdevs:
        nd = root / "class" / "net" / n.name
        _w(nd / "mtu", n.mtu)
        _w(nd / "operstate", n.operstate)
        if n.trust is not None:
            _w(nd / "qos" / "trust", n.trust)
        for kind, values in (("roce_np", n.ecn_np), ("roce_rp", n.ecn_rp)):
            for prio, on in (values or {}).items():
                _w(nd / "ecn" / kind / "enable" / str(prio), on)
        if n.ecn_np is not None:
            _w(nd / "ecn" / "roce_np" / "cnp_dscp", 48)
            _w(nd / "ecn" / "roce_np" / "cnp_802p_prio", 6)
    return root


def set_counters(root: Path, h: Hca) -> None:
    port = root / "class" / "infiniband" / h.name / "ports" / "1"
    for k, v in h.counters.items():
        _w(port / "counters" / k, v)
    for k, v in h.hw_counters.items():
        _w(port / "hw_counters" / k, v)
