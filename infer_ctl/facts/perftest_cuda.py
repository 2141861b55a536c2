"""The CUDA lines perftest prints with `--use_cuda=N` (perftest src/cuda_memory.c, 4.5 and 2018-era
releases): which GPU it picked, its name, the buffer, and the GPUDirect failures.

    initializing CUDA
    Listing all CUDA devices in system:          (newer)   |  There are 2 devices supporting CUDA, picking first...  (older)
    CUDA device 0: PCIe address is E1:00
    Picking device No. 0
    [pid = 4101, dev = 0] device name = [NVIDIA A40]
    cuMemAlloc() of a 2097152 bytes GPU buffer   |  allocated GPU buffer of a 16777216 address at 0x... for type CUDA_MEM_DEVICE
    Couldn't allocate MR                          (the HCA cannot register GPU memory: no nvidia-peermem / dma-buf)

The bandwidth rows are the ordinary perftest ones (facts/rdma_pingpong.py parses them).
"""

from __future__ import annotations

import re

from infer_ctl.core.diag.gdr import CudaInit

_DEV = re.compile(r"^CUDA device (\d+): PCIe address is ([0-9A-Fa-f:.]+)")
_NAME = re.compile(r"^\[pid = \d+, dev = (\d+)\] device name = \[(.*)\]")
_PICK = re.compile(r"^Picking device No\. (\d+)")
_BYTES = re.compile(r"(?:cuMemAlloc\(\) of a|allocated GPU buffer of a) (\d+) bytes")
_MR = re.compile(r"^Couldn't (?:allocate|register) (?:GPU )?MR(?: with error=(\d+))?")
_NO_CUDA = re.compile(r"unrecognized option '--use_cuda|invalid option.*use_cuda|not compiled with CUDA|"
                      r"CUDA is not supported", re.IGNORECASE)


def parse_cuda_init(text: str) -> CudaInit:
    out = CudaInit()
    for raw in text.splitlines():
        line = raw.strip()
        if line == "initializing CUDA":
            out.initialized = True
        elif m := _DEV.match(line):
            out.devices[int(m.group(1))] = m.group(2)
        elif m := _PICK.match(line):
            out.picked = int(m.group(1))
        elif m := _NAME.match(line):
            out.picked = int(m.group(1)) if out.picked is None else out.picked
            out.gpu_name = m.group(2)
        elif m := _BYTES.search(line):
            out.buffer_bytes = int(m.group(1))
        elif m := _MR.match(line):
            out.mr_failed = True
            out.mr_errno = int(m.group(1)) if m.group(1) else out.mr_errno
        elif _NO_CUDA.search(line):
            out.not_built = line
    return out
