"""Node fabric facts for rule tests, built the way the check builds them: the real gatherer script
over a sysfs tree, real ibv_devinfo-format text, real mlnx_qos / ethtool fixture outputs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from infer_ctl.core.fabric.facts import NetdevFacts, NodeFabricFacts
from infer_ctl.facts.ibv_devinfo import parse_ibv_devinfo
from infer_ctl.facts.qos import parse_ethtool_pause, parse_mlnx_qos
from infer_ctl.facts.rdma_sysfs import parse_sysfs_dump, sysfs_command
from tests.fabric.sysfs_tree import Hca, Netdev, build

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "rdma"
QOS_PRIO3 = (FIX / "mlnx_qos" / "netarbiter-eth4-trust-dscp-pfc-prio3.txt").read_text()
PAUSE_OFF = "Pause parameters for ens1f0np0:\nAutonegotiate:\toff\nRX:\t\toff\nTX:\t\toff\n"


def devinfo_text(devices: list[tuple[str, str, int]]) -> str:
    """ibv_devinfo -v shaped text (devinfo.c formats) for (name, link_layer, active_mtu)."""
    out = []
    for name, ll, mtu in devices:
        code = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}[mtu]
        out += [f"hca_id:\t{name}", "\ttransport:\t\t\tInfiniBand (0)", "\tphys_port_cnt:\t\t\t1",
                "\t\tport:\t1", "\t\t\tstate:\t\t\tPORT_ACTIVE (4)", "\t\t\tmax_mtu:\t\t4096 (5)",
                f"\t\t\tactive_mtu:\t\t{mtu} ({code})", f"\t\t\tlink_layer:\t\t{ll}", ""]
    return "\n".join(out)


def node_facts(
    tmp: Path,
    hcas: list[Hca] | None = None,
    netdevs: list[Netdev] | None = None,
    *,
    active_mtu: int = 4096,
    qos: str | None = QOS_PRIO3,
    pause: str | None = PAUSE_OFF,
    name: str = "pf-01",
) -> NodeFabricFacts:
    hcas = [Hca()] if hcas is None else hcas
    build(tmp, hcas, [Netdev()] if netdevs is None else netdevs)
    out = subprocess.run(list(sysfs_command(root=str(tmp)).argv), capture_output=True, text=True, check=True).stdout
    snap = parse_sysfs_dump(out)
    facts = NodeFabricFacts(name, sysfs=snap,
                            devinfo=parse_ibv_devinfo(devinfo_text([(h.name, h.link_layer, active_mtu) for h in hcas])))
    for nd in snap.netdevs:
        facts.netdevs[nd] = NetdevFacts(
            nd, sysfs=snap.netdevs[nd],
            qos=parse_mlnx_qos(qos) if qos else None, qos_error=None if qos else "neither mlnx_qos nor dcb is installed",
            pause=parse_ethtool_pause(pause) if pause else None, pause_error=None if pause else "ethtool is not installed",
        )
    facts.counter_deltas = {f"{h.name}/1": {} for h in hcas}
    facts.counter_interval_s = 1.0
    return facts
