"""Driver/CUDA report: parse the read-only probes and decide OK / MANUAL / REBOOT_REQUIRED.

inferctl never installs drivers: a wrong driver is MANUAL with instructions. An installed driver package
newer than the loaded module means a reboot is pending.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GPU_QUERY = "index,name,driver_version,persistence_mode"


@dataclass(frozen=True)
class DriverFacts:
    gpus: tuple[tuple[str, str, str], ...]  # (index, name, persistence_mode)
    loaded_version: str | None
    installed_version: str | None
    cuda_version: str | None
    kernel: str | None
    os_name: str | None


def parse_gpu_csv(text: str) -> tuple[list[tuple[str, str, str]], str | None]:
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


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))
