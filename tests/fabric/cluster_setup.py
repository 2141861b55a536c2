"""Fabric "nodes" for the real-sshd harness: a sysfs tree per node (INFERCTL_SYSFS_ROOT seam) and
stand-in RDMA tools on the node's PATH (tests/fabric/standins, each says what is real)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import ports
from tests.fabric.factories import PAUSE_OFF, QOS_PRIO3, devinfo_text
from tests.fabric.sysfs_tree import Hca, Netdev, build, mlx5_gids
from tests.waiting import wait_for

STANDINS = Path(__file__).resolve().parent / "standins"


@dataclass
class FabricNode:
    ipv4: str | None = "10.0.0.11"
    ipv6: str | None = None  # a global IPv6 GID instead of IPv4
    mode: str = "ok"
    qos: str = QOS_PRIO3
    pause: str = PAUSE_OFF
    netdev: Netdev = field(default_factory=Netdev)
    hca: dict[str, Any] = field(default_factory=dict)


def install_standin(bin_dir: Path, tool: str, source: str) -> None:
    text = (STANDINS / source).read_text()
    if text.startswith("#!/usr/bin/env python3"):
        text = f"#!{sys.executable}\n" + text.split("\n", 1)[1]
    (bin_dir / tool).write_text(text)
    (bin_dir / tool).chmod(0o755)


def setup_node(cluster: Any, sysfs_root: Path, name: str, spec: FabricNode) -> None:
    gids = mlx5_gids(spec.ipv4) if spec.ipv4 else [
        (0, "fe80::1:22", "IB/RoCE v1"), (1, "fe80::1:22", "RoCE v2"),
        (2, spec.ipv6 or "2001:db8::22", "IB/RoCE v1"), (3, spec.ipv6 or "2001:db8::22", "RoCE v2")]
    hca = Hca(gids=gids, **spec.hca)
    build(sysfs_root / name, [hca], [spec.netdev])
    bin_dir = cluster.bin_dir(name)
    for tool, out in (("ibv_devinfo", devinfo_text([(hca.name, hca.link_layer, 4096)])),
                      ("mlnx_qos", spec.qos), ("ethtool", spec.pause)):
        install_standin(bin_dir, tool, "standin-recorded-output")
        (bin_dir / f"{tool}.out").write_text(out)
    for tool in ("ibv_rc_pingpong", "ib_write_lat", "ib_write_bw"):  # one stand-in, behaving by the name it is run as
        install_standin(bin_dir, tool, "standin-ibv_rc_pingpong")
    table = {str(i): g for i, g, _ in gids}
    (bin_dir / "standin-rdma.json").write_text(json.dumps({"devices": {hca.name: table}, "mode": spec.mode}))
    if spec.ipv4:
        add_route(cluster, spec.ipv4, cluster.node(name).host)


def add_route(cluster: Any, address: str, via: str) -> None:
    """The simulated data-plane network: a pair-test client given `address` (the server's RoCE GID IPv4)
    reaches the node whose sshd listens on `via` (all nodes are this machine, on loopback addresses).
    One table per cluster, read by every node's stand-in (standin-ibv_rc_pingpong)."""
    routes_file = Path(cluster.root) / "standin-routes.json"
    routes = json.loads(routes_file.read_text()) if routes_file.exists() else {}
    routes[address] = via
    routes_file.write_text(json.dumps(routes))


def free_port_range(n: int = 64) -> int:
    """A base port whose next n ports were free a moment ago (other tests run concurrently), below the
    ephemeral range (tests/ports.py)."""
    return ports.free_port_range(n, "0.0.0.0")


def fabric_profile(cluster: Any, path: Path, base_port: int, **fabric: Any) -> Path:
    data = cluster.profile_data()
    for node in data["nodes"]:
        node["rdma"] = {"devices": ["mlx5_0"], "netdev": "ens1f0np0"}
    pingpong = {"perftest": False, "timeout_s": 4, "base_port": base_port, "iters": 100,
                "max_rtt_us": 5000.0, **fabric.pop("pingpong", {})}
    data["fabric"] = {"rate_gbps": 400, "netdev_mtu": 9000, "counter_interval_s": 0.2, "pingpong": pingpong, **fabric}
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def leftovers(root: Path) -> list[str]:
    """Processes still running a stand-in from this cluster, and pair-test temp dirs."""
    procs = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(root) in cmd and ("ibv_rc_pingpong" in cmd or "ib_write_" in cmd):
            procs.append(cmd)
    return procs


def pp_dirs() -> set[str]:
    return {p.name for p in Path("/tmp").glob("inferctl-pp.*")}


def new_pp_dirs(before: set[str], within: float = 10.0) -> set[str]:
    """Pair-test temp dirs made since `before` that stay: /tmp is the machine's, and a pair test of another
    suite on it has its own for a moment (a loaded run failed on one, gone a moment later); a dir of ours
    that the CLI left behind stays."""
    wait_for(lambda: not pp_dirs() - before, within)
    return pp_dirs() - before


__all__ = ["FabricNode", "add_route", "fabric_profile", "free_port_range", "leftovers", "new_pp_dirs", "pp_dirs", "setup_node"]
