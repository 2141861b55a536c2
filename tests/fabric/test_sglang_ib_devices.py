"""Which HCAs SGLang is given by --disaggregation-ib-device: ONE derivation (core.sglang.argv), read from
the argv `inferctl launch` renders, used by the fabric check to judge that those devices exist.

The fabric check used to re-derive the names on its own (every device_map value plus every extra-arg
value, whatever the backend and role); the cases where that disagreed with what SGLang 0.5.23 actually
receives are tested here, each with SGLang's reading."""

from __future__ import annotations

import pytest

from infer_ctl.core.fabric.expectations import expectations
from infer_ctl.core.sglang import build_argv, instances
from infer_ctl.core.sglang.argv import IB_DEVICE_FLAG, ib_device_names, sglang_ib_devices
from infer_ctl.profile import Profile


def _profile(pf: dict[str, object] | None = None, **extra: object) -> Profile:
    data: dict[str, object] = {
        "name": "t",
        "nodes": [
            {"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"],
             "rdma": {"devices": ["mlx5_0", "mlx5_1"], "device_map": {"0": "mlx5_0", "1": "mlx5_4"}}, **(pf or {})},
            {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"], "rdma": {"devices": ["mlx5_0"]}},
        ],
        **extra,
    }
    return Profile.model_validate(data)


def _argv_value(profile: Profile, node: str) -> str | None:
    """The value of the flag in the rendered command line (argparse: the last occurrence wins)."""
    value = None
    for inst in instances(profile):
        if inst.node == node:
            argv = build_argv(profile, inst).argv
            for i, tok in enumerate(argv):
                if tok == IB_DEVICE_FLAG:
                    value = argv[i + 1]
                elif tok.startswith(IB_DEVICE_FLAG + "="):
                    value = tok.split("=", 1)[1]
    return value


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("mlx5_0", ("mlx5_0",)),
        ("mlx5_0,mlx5_1", ("mlx5_0", "mlx5_1")),
        ("mlx5_0, mlx5_1", ("mlx5_0", "mlx5_1")),
        ('{"0": "mlx5_0", "1": "mlx5_5,mlx5_6", "2": "mlx5_0"}', ("mlx5_0", "mlx5_5", "mlx5_6")),
        ('{"0": "mlx5_0"', ('{"0": "mlx5_0"',)),  # malformed: reported whole, as a device that does not exist
        ("/etc/inferctl/ib.json", ()),  # a file on the node: SGLang reads it there, nothing to name here
        ("", ()),
        (None, ()),
    ],
)
def test_flag_values_read_as_sglang_reads_them(value: str | None, names: tuple[str, ...]) -> None:
    assert ib_device_names(value) == names


def test_the_check_takes_the_devices_from_the_rendered_argv() -> None:
    """Both nodes, several shapes: the check's names are exactly those in the launch command line."""
    for prof in (
        _profile(sglang={"prefill": {"tp": 2}}),
        _profile(pf={"overrides": {"extra_args": ["--disaggregation-ib-device", "mlx5_2"]}}),
        _profile(sglang={"extra_args": {"decode": ['--disaggregation-ib-device={"0": "mlx5_0,mlx5_3"}']}}),
    ):
        for node in ("pf-01", "dc-01"):
            assert expectations(prof, prof.node(node)).sglang_ib_devices == ib_device_names(_argv_value(prof, node))


def test_only_the_map_entries_of_the_servers_gpus() -> None:
    """Was: every device_map value. SGLang gets the map re-keyed to the GPUs the server runs on, so an
    entry for a GPU no server uses names a device SGLang never opens."""
    one_gpu = _profile()
    assert expectations(one_gpu, one_gpu.node("pf-01")).sglang_ib_devices == ("mlx5_0",)
    two_gpus = _profile(sglang={"prefill": {"tp": 2}})
    assert expectations(two_gpus, two_gpus.node("pf-01")).sglang_ib_devices == ("mlx5_0", "mlx5_4")


def test_an_extra_arg_replaces_the_profiles_value() -> None:
    """Was: the extra arg's devices added to the map's. The later flag wins in SGLang's argparse."""
    prof = _profile(pf={"overrides": {"extra_args": ["--disaggregation-ib-device=mlx5_7"]}})
    assert expectations(prof, prof.node("pf-01")).sglang_ib_devices == ("mlx5_7",)
    assert _argv_value(prof, "pf-01") == "mlx5_7"


def test_mooncake_tcp_gives_sglang_no_device() -> None:
    """Was: the map's values. SGLang 0.5.23 sets disaggregation_ib_device to None for mooncake_tcp."""
    prof = _profile(sglang={"transfer_backend": "mooncake_tcp",
                            "extra_args": {"prefill": ["--disaggregation-ib-device", "mlx5_9"]}})
    for inst in instances(prof):
        assert sglang_ib_devices(prof, inst) == ()
    assert expectations(prof, prof.node("pf-01")).sglang_ib_devices == ()


def test_collocated_servers_open_no_hca_for_kv_transfer() -> None:
    """Was: the map's values plus the collocated extra args. A server without --disaggregation-mode
    prefill/decode does not use the flag."""
    prof = _profile(collocated=True, sglang={"extra_args": {"collocated": ["--disaggregation-ib-device", "mlx5_9"]}})
    assert expectations(prof, prof.node("pf-01")).sglang_ib_devices == ()


def test_the_decode_role_flag_applies_to_decode_nodes_only() -> None:
    prof = _profile(sglang={"extra_args": {"decode": ["--disaggregation-ib-device", '{"0": "mlx5_0", "1": "mlx5_5,mlx5_6"}']}})
    assert expectations(prof, prof.node("dc-01")).sglang_ib_devices == ("mlx5_0", "mlx5_5", "mlx5_6")
    assert expectations(prof, prof.node("pf-01")).sglang_ib_devices == ("mlx5_0",)
