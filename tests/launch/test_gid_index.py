"""MC_GID_INDEX from the node's GID tables (launch/gid.py): the real sysfs gatherer run on this machine
over sysfs-shaped trees (tests/fabric/sysfs_tree.py, kernel file formats), then the decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core.fabric.facts import NodeFabricFacts
from infer_ctl.facts.rdma_sysfs import parse_sysfs_dump, sysfs_command
from infer_ctl.launch import gid
from infer_ctl.remote.local import LocalConnector
from tests.fabric.sysfs_tree import Hca, Netdev, build, mlx5_gids

E810 = [(0, "fe80::3efd:feff:fe9d:1a2b", "IB/RoCE v1"), (1, "::ffff:10.0.0.11", "RoCE v2"),
        (2, "fe80::3efd:feff:fe9d:1a2b", "RoCE v2")]  # fmt: skip


def _facts(tmp_path: Path, hcas: list[Hca]) -> NodeFabricFacts:
    root = build(tmp_path / "sys", hcas, [Netdev(h.netdev) for h in hcas])
    res = LocalConnector("n").run(sysfs_command(root=str(root)))
    assert res.ok, res.err
    return NodeFabricFacts("n", sysfs=parse_sysfs_dump(res.out))


@pytest.mark.parametrize(("hcas", "devices", "prefer", "index", "error"), [
    ([Hca()], (), "ipv4", 3, None),  # mlx5 layout: IPv4 RoCE v2 at 3
    ([Hca(gids=E810)], ("mlx5_0",), "ipv4", 1, None),  # not 3 everywhere
    ([Hca(gids=[*mlx5_gids(), (4, "2001:db8::11", "IB/RoCE v1"), (5, "2001:db8::11", "RoCE v2")])], (), "ipv6", 5, None),
    ([Hca(link_layer="InfiniBand")], (), "ipv4", None, None),  # IB: no GID index
    ([], (), "ipv4", None, None),  # nothing configured, nothing found
    ([Hca(gids=[(0, "fe80::1", "IB/RoCE v1"), (1, "::ffff:10.0.0.11", "IB/RoCE v1")])], (), "ipv4", None,
     "mlx5_0/1 has no RoCE v2 ipv4 GID"),
    ([Hca(gids=[(0, "fe80::1", "IB/RoCE v1"), (1, "fe80::1", "RoCE v2")])], (), "ipv4", None,
     "mlx5_0/1 has no RoCE v2 ipv4 GID"),  # only link-local IPv6
    ([Hca()], ("mlx5_0", "mlx5_1"), "ipv4", None, "HCA mlx5_1 is not on the node"),
    ([Hca(state="1: DOWN", phys_state="3: Disabled")], (), "ipv4", None, "HCA mlx5_0 has no ACTIVE port"),
    ([Hca(), Hca("mlx5_1", "ens2f0np0", gids=E810)], (), "ipv4", None,
     "the HCAs choose different GID indexes (mlx5_0/1: 3, mlx5_1/1: 1)"),
])  # fmt: skip
def test_decide(
    tmp_path: Path, hcas: list[Hca], devices: tuple[str, ...], prefer: str, index: int | None, error: str | None
) -> None:
    d = gid.decide(_facts(tmp_path, hcas), devices, prefer)  # type: ignore[arg-type]
    assert d.index == index, d
    if error is None:
        assert d.error is None, d
    else:
        assert d.error is not None and d.error.startswith(error), d
