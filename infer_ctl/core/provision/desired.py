"""Desired host state computed from the profile: file contents, sysctls, firewall ports.

Every managed file starts with a header naming inferctl, so an operator who finds it knows where it came
from and that local edits are reported as drift by `inferctl provision --plan`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

HEADER = "# Managed by inferctl provision; local edits show up as drift in `inferctl provision --plan`.\n"

SYSCTL_PATH = "/etc/sysctl.d/90-inferctl.conf"
LIMITS_PATH = "/etc/security/limits.d/90-inferctl.conf"
PEERMEM_PATH = "/etc/modules-load.d/nvidia-peermem.conf"
PERSISTENCE_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/override.conf"

#: Mooncake raises MKEY usage with many registered regions; its troubleshooting guide recommends this.
MAX_MAP_COUNT = 16777216
#: The Linux default ephemeral range, pinned so a distro tweak cannot move it onto the SGLang, bootstrap
#: or Mooncake RPC ports (15000-17000, 30000+ in the defaults); configured ports inside it get reserved.
LOCAL_PORT_RANGE = (32768, 60999)
MOONCAKE_RPC_RANGE = (15000, 17000)
ROCE_UDP_PORT = 4791


@dataclass(frozen=True)
class ManagedFile:
    """A file provisioning owns: where it goes, what it must contain, how it is protected."""

    path: str
    content: bytes
    mode: int = 0o644
    owner: str = "root"
    group: str = "root"


def sysctl_settings(reserved_ports: list[int], hugepages: int | None) -> dict[str, str]:
    """The kernel settings inferctl manages, in `sysctl -n` output form (tabs between range numbers)."""
    settings = {
        "vm.max_map_count": str(MAX_MAP_COUNT),
        "net.ipv4.ip_local_port_range": f"{LOCAL_PORT_RANGE[0]}\t{LOCAL_PORT_RANGE[1]}",
    }
    lo, hi = LOCAL_PORT_RANGE
    inside = sorted({p for p in reserved_ports if lo <= p <= hi})
    if inside:
        settings["net.ipv4.ip_local_reserved_ports"] = ",".join(str(p) for p in inside)
    if hugepages:
        settings["vm.nr_hugepages"] = str(hugepages)
    return settings


def sysctl_file(settings: dict[str, str]) -> ManagedFile:
    body = "".join(f"{key} = {value.replace(chr(9), ' ')}\n" for key, value in settings.items())
    return ManagedFile(SYSCTL_PATH, (HEADER + body).encode())


def normalize_sysctl_value(value: str) -> str:
    """`sysctl -n` separates range values with a tab; compare on single tabs, whatever the spacing."""
    return "\t".join(value.split())


def limits_file() -> ManagedFile:
    """memlock for interactive shells (PAM). Services get LimitMEMLOCK in their units: limits.conf does
    not apply to systemd services."""
    body = "*    soft    memlock    unlimited\n*    hard    memlock    unlimited\n"
    return ManagedFile(LIMITS_PATH, (HEADER + body).encode())


def persistence_dropin(nvidia_persistenced: str = "/usr/bin/nvidia-persistenced") -> ManagedFile:
    """Distribution units start nvidia-persistenced with --no-persistence-mode; clear ExecStart and
    start it in persistence mode (NVIDIA/ansible-role-nvidia-driver does the same). `nvidia-smi -pm 1`
    alone would not survive a reboot."""
    body = f"[Service]\nExecStart=\nExecStart={nvidia_persistenced} --verbose\n"
    return ManagedFile(PERSISTENCE_DROPIN, (HEADER + body).encode())


def peermem_file() -> ManagedFile:
    return ManagedFile(PEERMEM_PATH, (HEADER + "nvidia-peermem\n").encode())


def peermem_needed(transfer_backend: str, env: dict[str, str]) -> bool:
    """Mooncake registers GPU memory through DMA-BUF unless WITH_NVIDIA_PEERMEM=1; only then (or when the
    operator asks for it explicitly) is the legacy module needed."""
    if transfer_backend == "mooncake_tcp":
        return False
    return env.get("WITH_NVIDIA_PEERMEM", "").strip() in {"1", "true", "yes"}


def firewall_ports(
    server_ports: dict[str, int], *, mooncake: bool, rdma: bool, router_port: int | None
) -> list[str]:
    """Port specs (`30000/tcp`, `15000:17000/tcp`) a node must accept when a firewall is active."""
    ports = [f"{port}/tcp" for _, port in sorted(server_ports.items(), key=lambda kv: kv[1])]
    if mooncake:
        ports.append(f"{MOONCAKE_RPC_RANGE[0]}:{MOONCAKE_RPC_RANGE[1]}/tcp")
    if rdma:
        ports.append(f"{ROCE_UDP_PORT}/udp")
    if router_port is not None:
        ports.append(f"{router_port}/tcp")
    return ports


def missing_ports(wanted: list[str], allowed: set[str]) -> list[str]:
    """The wanted port specs an active firewall does not allow yet (both in ufw notation)."""
    return [p for p in wanted if p not in allowed]


def backup_path(path: str, when: datetime) -> str:
    """Backups sit beside the file with a suffix no loader reads (`*.conf`, `*.service` globs skip it)."""
    return f"{path}.inferctl-backup-{when.strftime('%Y%m%dT%H%M%S%fZ')}"
