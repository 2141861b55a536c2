"""What the check layer derives from the profile and the facts, without hosts: expectations
(devices, SGLang's --disaggregation-ib-device names, whether RDMA is needed) and pair endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core.fabric.endpoints import node_endpoints
from infer_ctl.core.fabric.expectations import expectations
from infer_ctl.core.fabric.rules import gid_families
from infer_ctl.profile import Profile
from tests.fabric.factories import node_facts
from tests.fabric.sysfs_tree import Hca, Netdev, mlx5_gids


def _profile(**extra: object) -> Profile:
    data = {
        "name": "t",
        "nodes": [
            {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"],
             "rdma": {"devices": ["mlx5_0", "mlx5_1"], "netdev": "ens1f0np0", "device_map": {"0": "mlx5_0", "1": "mlx5_4"}},
             "overrides": {"extra_args": ["--disaggregation-ib-device=mlx5_7"]}},
            {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "rdma": {"devices": ["mlx5_0"], "gid_index": 1}},
        ],
        "sglang": {"extra_args": {"decode": ["--disaggregation-ib-device", '{"0": "mlx5_0", "1": "mlx5_5,mlx5_6"}']}},
        **extra,
    }
    return Profile.model_validate(data)


def test_expectations_collect_sglang_device_names_and_policy() -> None:
    prof = _profile()
    pf = expectations(prof, prof.node("pf-01"))
    assert pf.devices == ("mlx5_0", "mlx5_1") and pf.netdev == "ens1f0np0" and pf.needs_rdma
    # the node's own --disaggregation-ib-device=mlx5_7 replaces the profile's map (SGLang gets only it:
    # tests/fabric/test_sglang_ib_devices.py); the decode-only flag is not its
    assert pf.sglang_ib_devices == ("mlx5_7",)
    dc = expectations(prof, prof.node("dc-01"))
    assert dc.gid_index == 1 and dc.sglang_ib_devices == ("mlx5_0", "mlx5_5", "mlx5_6")
    tcp = _profile(sglang={"transfer_backend": "mooncake_tcp"})
    assert not expectations(tcp, tcp.node("dc-01")).needs_rdma


def test_endpoints_take_active_ports_with_a_v2_gid(tmp_path: Path) -> None:
    prof = _profile()
    node = prof.node("pf-01")
    facts = node_facts(tmp_path, [Hca("mlx5_0"), Hca("mlx5_1", "ens1f1np1", state="1: DOWN", phys_state="3: Disabled")],
                       [Netdev(), Netdev("ens1f1np1")])
    eps = node_endpoints(node, facts, expectations(prof, node))
    assert [(e.endpoint.device, e.endpoint.gid_index, e.active_mtu, e.rate_gbps) for e in eps] == [("mlx5_0", 3, 4096, 400.0)]
    assert gid_families(facts, expectations(prof, node)) == {"ipv4"}


def test_pinned_gid_index_is_used_for_the_pair_test(tmp_path: Path) -> None:
    prof = _profile()
    node = prof.node("dc-01")
    facts = node_facts(tmp_path, [Hca(gids=mlx5_gids("10.0.0.21"))], name="dc-01")
    eps = node_endpoints(node, facts, expectations(prof, node))
    assert [e.endpoint.gid_index for e in eps] == [1]  # pinned: the link-local v2 GID


def test_cli_usage_errors_exit_64_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from infer_ctl.cli.main import main

    assert main(["check", "fabric", "-p", "builtin:local", "--pingpong", "--pairs", "ring"]) == 64
    err = capsys.readouterr().err
    assert "--pairs 'ring' is not a pair mode" in err and "prefill-decode" in err and "Traceback" not in err


def test_no_pairs_selected_is_a_warning_not_silence(capsys: pytest.CaptureFixture[str]) -> None:
    """builtin:local nodes are `connection: local`: this machine, where ibv_devinfo finds no device."""
    import json

    from infer_ctl.cli.main import main

    code = main(["check", "fabric", "-p", "builtin:local", "--pingpong", "--pairs", "explicit", "--json", "--nodes", "pf-01"])
    doc = json.loads(capsys.readouterr().out)
    pairs = [f for f in doc["findings"] if f["check"] == "fabric.pingpong"]
    assert code == 2 and pairs[0]["status"] == "warn" and "no node pairs" in pairs[0]["message"]
    assert doc["pairs"]["cells"] == []
