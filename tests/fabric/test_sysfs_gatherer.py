"""The sysfs gatherer script run for real by /bin/sh against directory trees (INFERCTL_SYSFS_ROOT seam)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from infer_ctl.facts.rdma_sysfs import (
    counter_deltas,
    counters_command,
    parse_counters_dump,
    parse_sysfs_dump,
    sysfs_command,
)
from tests.fabric.sysfs_tree import Hca, Netdev, build, set_counters


def _run(argv: tuple[str, ...], env: dict[str, str] | None = None) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, env=env, timeout=20).stdout


def test_gatherer_reads_devices_gids_netdevs_and_skips_empty_slots(tmp_path: Path) -> None:
    build(tmp_path, [Hca("mlx5_0", "ens1f0np0"), Hca("mlx5_1", "ens1f1np1", state="1: DOWN", phys_state="3: Disabled")],
          [Netdev("ens1f0np0"), Netdev("ens1f1np1", mtu=1500, trust=None, ecn_np=None, ecn_rp=None)])
    snap = parse_sysfs_dump(_run(sysfs_command(root=str(tmp_path)).argv))
    assert snap.ib_present
    assert sorted(snap.devices) == ["mlx5_0", "mlx5_1"]
    p0 = snap.devices["mlx5_0"].ports[1]
    assert (p0.state, p0.phys_state, p0.rate_gbps, p0.link_layer) == ("ACTIVE", "LinkUp", 400.0, "Ethernet")
    assert [g.index for g in p0.gids] == [0, 1, 2, 3]  # the zero GID in slot 4 is skipped
    assert p0.gids[3].gid == "0000:0000:0000:0000:0000:ffff:0a00:000b" and p0.gids[3].type == "RoCE v2"
    assert p0.gids[3].ndev == "ens1f0np0"
    assert snap.devices["mlx5_1"].ports[1].state == "DOWN"
    assert snap.devices["mlx5_0"].netdevs == ["ens1f0np0"]
    nd = snap.netdevs["ens1f0np0"]
    assert (nd.mtu, nd.trust, nd.ecn_np[3], nd.ecn_rp[3], nd.ecn_np[0], nd.cnp_dscp) == (9000, "dscp", True, True, False, 48)
    up = snap.netdevs["ens1f1np1"]
    assert (up.mtu, up.trust, up.ecn_np) == (1500, None, {})


def test_env_var_root_and_missing_tree(tmp_path: Path) -> None:
    out = _run(sysfs_command(["ens9"]).argv, env={"INFERCTL_SYSFS_ROOT": str(tmp_path / "nothing"), "PATH": "/usr/bin:/bin"})
    snap = parse_sysfs_dump(out)
    assert not snap.ib_present and snap.devices == {} and snap.missing_netdevs == ["ens9"]


def test_counter_deltas_between_two_samples(tmp_path: Path) -> None:
    hca = Hca()
    build(tmp_path, [hca], [Netdev()])
    before = parse_counters_dump(_run(counters_command(str(tmp_path)).argv))
    hca.counters["symbol_error"] = 7
    hca.hw_counters["np_cnp_sent"] = 100
    set_counters(tmp_path, hca)
    after = parse_counters_dump(_run(counters_command(str(tmp_path)).argv))
    assert counter_deltas(before, after) == {"mlx5_0/1": {"symbol_error": 7, "np_cnp_sent": 100}}


def test_counter_reset_is_not_growth() -> None:
    assert counter_deltas({"d/1": {"link_downed": 5}}, {"d/1": {"link_downed": 0}}) == {"d/1": {}}
