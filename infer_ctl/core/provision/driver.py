"""Driver version comparison for the driver report (the probes and their parsers: facts/gpu_driver.py).

inferctl never installs drivers: a wrong driver is MANUAL with instructions. An installed driver package
newer than the loaded module means a reboot is pending.
"""

from __future__ import annotations

import re


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def torch_cuda_fit(torch_cuda: str, driver_cuda: str) -> tuple[str, str]:
    """(kind, why) for a torch build of CUDA `torch_cuda` on a driver whose newest CUDA is
    `driver_cuda` (nvidia-smi's "CUDA Version"). A newer major version cannot initialise at all; a newer
    minor version of the same major runs under CUDA's minor version compatibility, but kernels that
    need the newer driver (PTX JIT, which SGLang's JIT-compiled kernels rely on) fail at run time
    (https://docs.nvidia.com/deploy/cuda-compatibility/)."""
    have, need = version_tuple(driver_cuda), version_tuple(torch_cuda)
    if not have or not need:
        return "ok", f"torch CUDA {torch_cuda}, driver CUDA {driver_cuda}"
    if need[0] > have[0]:
        return "manual", (f"torch is built for CUDA {torch_cuda}, the driver supports CUDA {driver_cuda} at most: "
                          "CUDA cannot initialise")  # fmt: skip
    if need > have:
        return "warn", (f"torch is built for CUDA {torch_cuda}, the driver supports CUDA {driver_cuda}: it runs "
                        "under minor version compatibility only (PTX JIT and newer-driver features fail)")  # fmt: skip
    return "ok", f"torch CUDA {torch_cuda} build, the driver supports CUDA {driver_cuda}"
