"""What the provisioning driver report reads, read-only: the GPUs and loaded driver version
(`nvidia-smi --query-gpu` CSV), the highest CUDA version the driver supports (the `nvidia-smi` banner),
the installed kernel module's version (`modinfo`), the OS (`/etc/os-release`) and the kernel."""

from __future__ import annotations

import re

from infer_ctl.remote.base import Command

GPU_QUERY = "index,name,driver_version,persistence_mode"

NVIDIA_SMI_QUERY_GPU = Command("nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader")
NVIDIA_SMI_BANNER = Command("nvidia-smi")
MODINFO_NVIDIA_VERSION = Command("modinfo", "-F", "version", "nvidia")
OS_RELEASE = Command("cat", "/etc/os-release")
KERNEL_RELEASE = Command("uname", "-r")


def parse_gpu_csv(text: str) -> tuple[list[tuple[str, str, str]], str | None]:
    """(index, name, persistence_mode) per GPU, and the driver version of the first row."""
    gpus, version = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 4 or not cells[0].isdigit():
            continue
        gpus.append((cells[0], cells[1], cells[3]))
        version = version or cells[2]
    return gpus, version


def parse_cuda_version(nvidia_smi_table: str) -> str | None:
    match = re.search(r"CUDA Version:\s*([0-9.]+)", nvidia_smi_table)
    return match.group(1) if match else None


def parse_os_release(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    return None
