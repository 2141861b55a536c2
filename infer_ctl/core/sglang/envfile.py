"""The environment file of one instance: read by systemd (EnvironmentFile=) and, on nodes without
systemd, sourced by sh (`set -a; . FILE`). Values are written so both read them the same way."""

from __future__ import annotations

import ipaddress
import re

from infer_ctl.core.sglang.instance import Instance
from infer_ctl.errors import ProfileError
from infer_ctl.profile import Profile

_BARE = re.compile(r"^[A-Za-z0-9_./:,@%+=-]*$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote_env_value(name: str, value: str) -> str:
    """Bare when safe, else single-quoted: systemd and sh both take single quotes literally (no `$`
    expansion, no escapes). A value holding a single quote or a newline has no common spelling."""
    if _BARE.match(value):
        return value
    if "'" in value or "\n" in value:
        raise ProfileError(
            f"sglang.env.{name}: the value contains a single quote or a newline, which an env file "
            "cannot carry for both systemd and sh",
            remedy="remove the quote/newline, or pass the setting as an extra arg instead",
        )
    return f"'{value}'"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def env_vars(profile: Profile, instance: Instance, *, gid_index: int | None = None) -> dict[str, str]:
    """The variables, in file order. `gid_index` (from the fabric facts) wins over the profile's."""
    env: dict[str, str] = {
        # models are provisioned to local disk; a server must never reach out to a hub at start-up
        "HF_HUB_OFFLINE": "1",
        # log lines reach the journal / log file as they happen, not at buffer flush
        "PYTHONUNBUFFERED": "1",
    }
    if instance.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in instance.gpus)
    if _is_ip(instance.host) and instance.role != "collocated":
        # the ZMQ/Mooncake handshake address; auto-detection picks the wrong NIC on multi-NIC hosts
        env["SGLANG_HOST_IP"] = instance.host
    if instance.role in ("prefill", "decode"):
        dis = profile.sglang.disaggregation
        env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] = str(dis.bootstrap_timeout_s)
        env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] = str(dis.waiting_timeout_s)
        env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] = _num(dis.heartbeat_interval_s)
        env["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"] = str(dis.heartbeat_max_failure)
        env.update(_mooncake_env(profile, instance, gid_index))
    if instance.nnodes > 1:
        env.update(multinode_env(profile, instance, gid_index))
    # the user's settings come last: they override what is rendered above (e.g. NCCL_SOCKET_IFNAME)
    for name, value in profile.sglang.env.items():
        if not _NAME.match(name):
            raise ProfileError(
                f"sglang.env.{name}: not a valid environment variable name",
                remedy="use letters, digits and underscores, not starting with a digit",
            )
        env[name] = value
    return env


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _mooncake_env(profile: Profile, instance: Instance, gid_index: int | None) -> dict[str, str]:
    backend = profile.sglang.transfer_backend
    if backend == "mooncake_tcp":
        return {"MC_FORCE_TCP": "1"}
    if backend != "mooncake":
        return {}
    node = profile.node(instance.node)
    env = {"MOONCAKE_PROTOCOL": "rdma"}
    gid = gid_index if gid_index is not None else (node.rdma.gid_index if node.rdma else None)
    if gid is not None:
        # Mooncake defaults to GID 3; a wrong index shows as an all-zero GID and failed transfers
        env["MC_GID_INDEX"] = str(gid)
    env["MC_MTU"] = str(profile.fabric_policy_for(node).mtu)
    return env


def multinode_env(profile: Profile, instance: Instance, gid_index: int | None) -> dict[str, str]:
    """NCCL and gloo settings of a server spanning nodes (`--nnodes` > 1), from the node's
    `nodes[].rdma`. Their tensor-parallel collectives cross the fabric, and the libraries' own choices
    go wrong on a multi-NIC RoCE host (NCCL env reference:
    https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html; gloo: torch.distributed's
    GLOO_SOCKET_IFNAME):
    - NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME = `rdma.netdev`: the interface for NCCL's bootstrap and
      socket fallback and for torch's gloo CPU groups. Left alone, both take the first non-loopback
      interface (docker0, a management NIC) that the peer may not reach. `=` makes NCCL match the name
      exactly (its default is a prefix match: `ens1f0` would also match `ens1f0v1`).
    - NCCL_IB_HCA = the node's HCAs (`rdma.devices`, else the `device_map` values), exact match (`=`):
      otherwise NCCL uses every RDMA device it finds, including ones not on the fabric.
    - NCCL_IB_GID_INDEX = the GID index Mooncake gets as MC_GID_INDEX (pinned, or read on the node at
      launch): on RoCE the GID decides RoCE v1 vs v2 and IPv4 vs IPv6, and NCCL's default (or its own
      pick) need not be the one the switches' PFC/ECN setup expects. Not set when no index is known
      (InfiniBand needs none).
    Not rendered for a single-node server: its collectives stay on NVLink/PCIe. `sglang.env` overrides
    any of them."""
    rdma = profile.node(instance.node).rdma
    if rdma is None:
        return {}
    env: dict[str, str] = {}
    if rdma.netdev:
        env["NCCL_SOCKET_IFNAME"] = f"={rdma.netdev}"
        env["GLOO_SOCKET_IFNAME"] = rdma.netdev
    hcas = list(dict.fromkeys([*rdma.devices, *_map_devices(rdma.device_map)]))
    if hcas:
        env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
    gid = gid_index if gid_index is not None else rdma.gid_index
    if gid is not None and hcas:
        env["NCCL_IB_GID_INDEX"] = str(gid)
    return env


def _map_devices(device_map: dict[str, str] | None) -> list[str]:
    names: list[str] = []
    for value in (device_map or {}).values():
        names.extend(v.strip() for v in value.split(",") if v.strip())
    return names


def env_lines(profile: Profile, instance: Instance, *, gid_index: int | None = None) -> list[str]:
    """`NAME=value` lines, quoted for both systemd and sh."""
    return [
        f"{k}={quote_env_value(k, v)}" for k, v in env_vars(profile, instance, gid_index=gid_index).items()
    ]
