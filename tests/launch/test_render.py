"""Rendering of SGLang argv, env files and units: table-driven against exact expected output."""

from __future__ import annotations

from typing import Any

import pytest

from infer_ctl.core.sglang import build_argv, find_instance, server_args
from infer_ctl.errors import ProfileError, UsageError
from infer_ctl.launch.render import (
    env_file_path,
    instances,
    render_argv,
    render_env_file,
    render_unit,
    systemd_quote,
    unit_name,
    unit_path,
)
from infer_ctl.profile import Profile, load_profile
from infer_ctl.profile.load import validate_profile_data

PY = "/opt/inferctl/venvs/0.5.23/bin/python"
SPEC = [
    "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "/m/draft",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]  # fmt: skip


def _profile(**over: Any) -> Profile:
    data: dict[str, Any] = {
        "name": "t",
        "nodes": [
            {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8,
             "rdma": {"devices": ["mlx5_0", "mlx5_1"], "gid_index": 3}},
            {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8},
        ],
        "models": {
            "target": {"path": "/m/target", "tp": 8},
            "draft": {"path": "/m/draft", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                      "num_draft_tokens": 4},
        },
    }  # fmt: skip
    for key, value in over.items():
        data[key] = value
    return validate_profile_data(data)


def _argv(profile: Profile, name: str) -> list[str]:
    return render_argv(profile, find_instance(profile, name))


def test_prefill_argv_is_exact() -> None:
    p = _profile()
    assert _argv(p, "pf-01-prefill") == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/m/target", "--tp-size", "8", "--dp-size", "1",
        "--host", "10.0.0.11", "--port", "30000",
        "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-bootstrap-port", "8998", "--disaggregation-ib-device", "mlx5_0,mlx5_1",
        *SPEC, "--enable-metrics", "--enable-cache-report",
    ]  # fmt: skip


def test_decode_argv_has_same_spec_flags_and_no_ib_device_without_rdma() -> None:
    p = _profile()
    assert _argv(p, "dc-01-decode") == [
        PY, "-m", "sglang.launch_server",
        "--model-path", "/m/target", "--tp-size", "8", "--dp-size", "1",
        "--host", "10.0.0.21", "--port", "30001",
        "--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake",
        "--disaggregation-bootstrap-port", "8998",
        *SPEC, "--enable-metrics", "--enable-cache-report",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("over", "instance", "expected_fragment"),
    [
        # named pinned prefixes need the priority eviction policy
        (
            {"router": {"prefixes": [{"name": "sys", "text": "hi", "pin": True}]}},
            "pf-01-prefill",
            ["--radix-eviction-policy", "priority"],
        ),
        (
            {"sglang": {"kv_events": {"publisher": "zmq", "endpoint": "tcp://*:5557"}}},
            "dc-01-decode",
            ["--kv-events-config", '{"endpoint":"tcp://*:5557","publisher":"zmq"}'],
        ),
        (
            {"sglang": {"prefill": {"host": "0.0.0.0", "bootstrap_port": 9000}}},
            "pf-01-prefill",
            ["--host", "0.0.0.0", "--port", "30000"],
        ),
        (
            {"sglang": {"prefill": {"bootstrap_port": 9000}}},
            "pf-01-prefill",
            ["--disaggregation-bootstrap-port", "9000"],
        ),
        ({"sglang": {"mem_fraction_static": 0.8}}, "pf-01-prefill", ["--mem-fraction-static", "0.8"]),
        (
            {"sglang": {"transfer_backend": "nixl"}},
            "pf-01-prefill",
            [
                "--disaggregation-transfer-backend",
                "nixl",
                "--disaggregation-bootstrap-port",
                "8998",
                "--disaggregation-ib-device",
                "mlx5_0,mlx5_1",
            ],
        ),
        ({"sglang": {"decode": {"tp": 4, "dp": 2}}}, "dc-01-decode", ["--tp-size", "4", "--dp-size", "2"]),
    ],
)
def test_profile_settings_render_to_flags(over: dict, instance: str, expected_fragment: list[str]) -> None:
    argv = _argv(_profile(**over), instance)
    joined = "\x00".join(argv)
    assert "\x00".join(expected_fragment) in joined, argv


def test_mooncake_tcp_drops_ib_device() -> None:
    argv = _argv(_profile(sglang={"transfer_backend": "mooncake_tcp"}), "pf-01-prefill")
    assert "--disaggregation-ib-device" not in argv
    assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "mooncake_tcp"


def test_per_gpu_device_map_renders_as_sorted_json() -> None:
    p = _profile(nodes=[
        {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 2,
         "rdma": {"devices": ["mlx5_0"], "device_map": {"1": "mlx5_2", "0": "mlx5_0,mlx5_1"}}},
        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 2},
    ], models={"target": {"path": "/m", "tp": 2}})  # fmt: skip
    argv = _argv(p, "pf-01-prefill")
    assert argv[argv.index("--disaggregation-ib-device") + 1] == '{"0":"mlx5_0,mlx5_1","1":"mlx5_2"}'


def test_spec_numbers_unset_render_no_numbers_and_ngram_needs_no_path() -> None:
    p = _profile(models={"target": {"path": "/m", "tp": 8}, "draft": {"algorithm": "NGRAM"}})
    argv = _argv(p, "dc-01-decode")
    assert argv[argv.index("--speculative-algorithm") + 1] == "NGRAM"
    assert not [a for a in argv if a.startswith("--speculative-") and a != "--speculative-algorithm"]


def test_extra_args_override_profile_with_recorded_warning() -> None:
    p = _profile(sglang={"extra_args": {"decode": ["--tp", "4", "--cuda-graph-max-bs-decode", "64"]}})
    rendered = build_argv(p, find_instance(p, "dc-01-decode"))
    assert "--tp-size" not in rendered.argv
    assert rendered.argv[-4:] == ["--tp", "4", "--cuda-graph-max-bs-decode", "64"]
    assert len(rendered.overrides) == 1
    ov = rendered.overrides[0]
    assert (ov.flag, ov.profile_value, ov.extra_value) == ("--tp-size", "8", "4")
    assert "sglang.extra_args.decode sets --tp-size 4, overriding the profile's 8" in ov.message


def test_node_extra_args_apply_to_that_node_only() -> None:
    p = _profile(nodes=[
        {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8,
         "overrides": {"extra_args": ["--enable-metrics", "--log-level=debug"]}},
        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8},
    ])  # fmt: skip
    rendered = build_argv(p, find_instance(p, "pf-01-prefill"))
    # `--flag=value` is normalised to two words, as argparse reads it
    assert rendered.argv[-3:] == ["--enable-metrics", "--log-level", "debug"]
    assert rendered.argv.count("--enable-metrics") == 1
    assert rendered.overrides == []  # the same switch again is no contradiction
    assert "--log-level" not in _argv(p, "dc-01-decode")


def test_instance_spanning_two_nodes_gets_multinode_flags() -> None:
    p = _profile(nodes=[
        {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8},
        {"name": "pf-02", "host": "10.0.0.12", "roles": ["prefill"], "gpus": 8},
        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8},
        {"name": "dc-02", "host": "10.0.0.22", "roles": ["decode"], "gpus": 8},
    ], models={"target": {"path": "/m", "tp": 16}}, sglang={"decode": {"tp": 8}})  # fmt: skip
    insts = {i.name: i for i in instances(p)}
    assert [i.name for i in instances(p)] == [
        "pf-01-prefill",
        "pf-02-prefill",
        "dc-01-decode",
        "dc-02-decode",
    ]
    assert insts["pf-02-prefill"].group == "pf-01-prefill" and not insts["pf-02-prefill"].is_leader
    for name, rank in (("pf-01-prefill", "0"), ("pf-02-prefill", "1")):
        argv = _argv(p, name)
        i = argv.index("--nnodes")
        assert argv[i : i + 6] == [
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--dist-init-addr",
            "10.0.0.11:25000",
        ]
    assert "--nnodes" not in _argv(p, "dc-01-decode")
    assert insts["pf-01-prefill"].gpus == tuple(range(8))


def test_node_with_both_roles_splits_gpus_and_engine_info_ports() -> None:
    p = _profile(nodes=[
        {"name": "box", "host": "10.0.0.5", "roles": ["prefill", "decode"], "gpus": 8},
    ], models={"target": {"path": "/m", "tp": 4}})  # fmt: skip
    pre, dec = instances(p)
    assert (pre.gpus, dec.gpus) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert "6789" in _argv(p, "box-prefill") and "6790" in _argv(p, "box-decode")
    assert unit_name(pre) != unit_name(dec) and env_file_path(pre) != env_file_path(dec)


def test_too_few_gpus_is_a_profile_error_naming_the_node() -> None:
    p = _profile(nodes=[{"name": "box", "host": "10.0.0.5", "roles": ["prefill", "decode"], "gpus": 8}])
    with pytest.raises(ProfileError, match=r"box has 8 GPUs but its prefill and decode servers need 16"):
        instances(p)


def test_uneven_multinode_grouping_is_a_profile_error() -> None:
    p = _profile(models={"target": {"path": "/m", "tp": 16}})
    with pytest.raises(ProfileError, match=r"1 prefill node\(s\) cannot be grouped into servers of 2 nodes"):
        instances(p)


def test_unknown_instance_name_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as exc:
        find_instance(_profile(), "nope")
    assert "pf-01-prefill, dc-01-decode" in (exc.value.remedy or "")
    assert find_instance(_profile(), "dc-01").name == "dc-01-decode"


def test_env_file_prefill_is_exact() -> None:
    p = _profile(sglang={"env": {"NCCL_DEBUG": "WARN", "X_ARGS": "a b $c"}})
    text = render_env_file(p, find_instance(p, "pf-01-prefill"), gid_index=5)
    assert text.splitlines()[2:] == [
        "HF_HUB_OFFLINE=1",
        "PYTHONUNBUFFERED=1",
        "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7",
        "SGLANG_HOST_IP=10.0.0.11",
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=300",
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300",
        "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL=5",
        "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE=2",
        "MOONCAKE_PROTOCOL=rdma",
        "MC_GID_INDEX=5",  # the fabric fact wins over the profile's 3
        "MC_MTU=4096",
        "NCCL_DEBUG=WARN",
        "X_ARGS='a b $c'",
    ]
    assert "MC_GID_INDEX=3" in render_env_file(p, find_instance(p, "pf-01-prefill"))
    assert "MC_GID_INDEX" not in render_env_file(p, find_instance(p, "dc-01-decode"))


def test_env_file_mooncake_tcp_and_bad_value() -> None:
    p = _profile(sglang={"transfer_backend": "mooncake_tcp"})
    text = render_env_file(p, find_instance(p, "dc-01-decode"))
    assert "MC_FORCE_TCP=1" in text and "MOONCAKE_PROTOCOL" not in text
    bad = _profile(sglang={"env": {"A": "it's"}})
    with pytest.raises(ProfileError, match=r"sglang.env.A: the value contains a single quote"):
        render_env_file(bad, find_instance(bad, "dc-01-decode"))


def test_unit_has_the_lifecycle_settings() -> None:
    p = _profile(sglang={"lifecycle": {"user": "sglang", "stop_timeout_s": 90}})
    inst = find_instance(p, "pf-01-prefill")
    unit = render_unit(p, inst)
    assert unit_path(inst) == "/etc/systemd/system/inferctl-sglang-prefill.service"
    for line in [
        "After=network-online.target",
        "Wants=network-online.target",
        "User=sglang",
        "EnvironmentFile=/etc/inferctl/sglang-prefill.env",
        "ExecStart=" + " ".join(render_argv(p, inst)),
        "TimeoutStartSec=1800",
        "TimeoutStopSec=90",
        "KillSignal=SIGTERM",
        "Restart=on-failure",
        "LimitMEMLOCK=infinity",
        "LimitNOFILE=1048576",
        "WantedBy=multi-user.target",
    ]:
        assert line in unit.splitlines(), line
    assert "After=inferctl-sglang-prefill.service" in render_unit(p, find_instance(p, "dc-01-decode"))


def test_systemd_quoting_of_json_and_specials() -> None:
    assert systemd_quote("/m/x") == "/m/x"
    assert systemd_quote('{"0":"mlx5_0"}') == '"{\\"0\\":\\"mlx5_0\\"}"'
    assert systemd_quote("a $b 100%") == '"a $$b 100%%"'


@pytest.mark.parametrize("name", ["local", "reference-h100-h200", "single-node-collocated"])
def test_every_shipped_profile_renders(name: str) -> None:
    p = load_profile(f"builtin:{name}")
    for inst in instances(p):
        argv = render_argv(p, inst)
        assert server_args(argv)[0] == "--model-path"
        assert render_unit(p, inst).count("ExecStart=") == 1
        assert render_env_file(p, inst).startswith(f"# {inst.name}:")


def _box(device_map: dict[str, str], **sglang: Any) -> Profile:
    return _profile(nodes=[
        {"name": "box", "host": "10.0.0.5", "roles": ["prefill", "decode"], "gpus": 8,
         "rdma": {"devices": ["mlx5_0"], "device_map": device_map}},
    ], models={"target": {"path": "/m", "tp": 4}}, sglang=sglang)  # fmt: skip


def test_device_map_is_rekeyed_to_the_gpus_the_process_sees() -> None:
    # physical GPUs 4-7 are CUDA_VISIBLE_DEVICES=4,5,6,7 for the decode, which SGLang sees as 0-3
    p = _box({str(g): f"mlx5_{g // 2}" for g in range(8)})
    dec = find_instance(p, "box-decode")
    assert dec.gpus == (4, 5, 6, 7)
    argv = render_argv(p, dec)
    assert argv[argv.index("--disaggregation-ib-device") + 1] == '{"0":"mlx5_2","1":"mlx5_2","2":"mlx5_3","3":"mlx5_3"}'
    assert "CUDA_VISIBLE_DEVICES=4,5,6,7" in render_env_file(p, dec)
    pre = render_argv(p, find_instance(p, "box-prefill"))
    assert pre[pre.index("--disaggregation-ib-device") + 1] == '{"0":"mlx5_0","1":"mlx5_0","2":"mlx5_1","3":"mlx5_1"}'


def test_device_map_missing_gpus_is_reported_before_launch() -> None:
    from infer_ctl.core.sglang.consistency import launch_problems

    p = _box({"0": "mlx5_0", "1": "mlx5_0", "2": "mlx5_1", "3": "mlx5_1"})  # only the prefill's GPUs
    fails = [f for f in launch_problems(p) if f.check == "launch.ib_device"]
    assert [(f.subject, f.status.value) for f in fails] == [("box-decode", "fail")]
    assert "no HCA for GPU(s) 4, 5, 6, 7" in fails[0].message
    # with nothing to map, the decode falls back to the node's HCA list rather than an empty map
    argv = render_argv(p, find_instance(p, "box-decode"))
    assert argv[argv.index("--disaggregation-ib-device") + 1] == "mlx5_0"


def test_kv_events_on_a_node_with_both_roles_collide() -> None:
    from infer_ctl.core.sglang.consistency import launch_problems

    full = {str(g): "mlx5_0" for g in range(8)}
    p = _box(full, kv_events={"publisher": "zmq", "endpoint": "tcp://*:5557"})
    kv = [f for f in launch_problems(p) if f.check == "launch.kv_events"]
    assert [(f.subject, f.status.value) for f in kv] == [("box-decode", "fail")]
    assert "collide with box-prefill" in kv[0].message
    # a per-node override moving the decode's publisher clears it (the prefill keeps 5557)
    moved = _profile(nodes=[
        {"name": "box", "host": "10.0.0.5", "roles": ["prefill", "decode"], "gpus": 8},
    ], models={"target": {"path": "/m", "tp": 4}}, sglang={
        "kv_events": {"publisher": "zmq"},
        "extra_args": {"decode": ["--kv-events-config", '{"publisher":"zmq","endpoint":"tcp://*:5600"}']}})  # fmt: skip
    assert not [f for f in launch_problems(moved) if f.check == "launch.kv_events"]
    # the default publisher ("null") binds nothing
    assert not [f for f in launch_problems(_box(full, kv_events={"topic": "x"})) if f.check == "launch.kv_events"]


def _wide(**sglang: Any) -> Profile:
    rdma = {"devices": ["mlx5_0", "mlx5_1"], "netdev": "ens1f0np0", "gid_index": 3}
    return _profile(nodes=[
        {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"], "gpus": 8, "rdma": rdma},
        {"name": "pf-02", "host": "10.0.0.12", "roles": ["prefill"], "gpus": 8,
         "rdma": {"device_map": {"0": "mlx5_2,mlx5_3", "1": "mlx5_4"}, "netdev": "ens2f0np0"}},
        {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "gpus": 8, "rdma": rdma},
    ], models={"target": {"path": "/m", "tp": 16}}, sglang={"decode": {"tp": 8}, **sglang})  # fmt: skip


def _env(p: Profile, name: str, gid_index: int | None = None) -> dict[str, str]:
    text = render_env_file(p, find_instance(p, name), gid_index=gid_index)
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_multinode_server_gets_nccl_and_gloo_env_from_the_node_rdma_settings() -> None:
    p = _wide()
    env = _env(p, "pf-01-prefill")
    assert {k: env[k] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX")} == {
        "NCCL_SOCKET_IFNAME": "=ens1f0np0", "GLOO_SOCKET_IFNAME": "ens1f0np0",
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1", "NCCL_IB_GID_INDEX": "3"}  # fmt: skip
    # the GID index read on the node (launch's probe) is the one NCCL and Mooncake both get
    assert _env(p, "pf-01-prefill", gid_index=1)["NCCL_IB_GID_INDEX"] == "1" == _env(p, "pf-01-prefill", 1)["MC_GID_INDEX"]
    # rank 1 uses its own node's netdev and HCAs (from its device map); no index pinned or read: none
    rank1 = _env(p, "pf-02-prefill")
    assert (rank1["NCCL_SOCKET_IFNAME"], rank1["NCCL_IB_HCA"]) == ("=ens2f0np0", "=mlx5_2,mlx5_3,mlx5_4")
    assert "NCCL_IB_GID_INDEX" not in rank1
    # a single-node server keeps NCCL's own choices (NVLink/PCIe collectives)
    assert not {k for k in _env(p, "dc-01-decode") if k.startswith(("NCCL_", "GLOO_"))}


def test_sglang_env_overrides_the_rendered_nccl_settings() -> None:
    env = _env(_wide(env={"NCCL_SOCKET_IFNAME": "bond0", "NCCL_IB_GID_INDEX": "5"}), "pf-01-prefill")
    assert (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_GID_INDEX"], env["GLOO_SOCKET_IFNAME"]) == ("bond0", "5", "ens1f0np0")
