"""`check fabric --gdr`: ib_write_bw between prefill and decode pairs with both ends' buffers in GPU
memory (perftest --use_cuda), i.e. the path a KV transfer takes (Mooncake/NIXL register GPU memory with
the HCA). The pair test's own verdict (core/fabric/judge.py) is re-labelled `fabric.gdr`, held to
`fabric.gdr.min_bw_fraction` of the slower link, and given the GPUDirect remedies: "Couldn't allocate MR"
means the HCA could not register GPU memory (nvidia-peermem not loaded, or dma-buf needed with the open
kernel modules: perftest issues #31, #126, #280); perftest without CUDA rejects --use_cuda.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from infer_ctl.core.findings import Finding, Status

PEERMEM = ("the HCA cannot register GPU memory: load nvidia-peermem (`modprobe nvidia-peermem`; the GPU "
           "Operator's nvidia-peermem / network-operator's GPUDirect setting on Kubernetes) or, with the open "
           "kernel modules, use dma-buf (try ib_write_bw --use_cuda=N --use_cuda_dmabuf by hand); without it KV "
           "transfers bounce through host memory or fail")


@dataclass
class CudaInit:
    initialized: bool = False
    devices: dict[int, str] = field(default_factory=dict)
    picked: int | None = None
    gpu_name: str | None = None
    buffer_bytes: int | None = None
    mr_failed: bool = False
    mr_errno: int | None = None
    #: the line saying perftest has no CUDA support
    not_built: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"gpu": self.picked, "gpu_name": self.gpu_name, "gpu_pci": self.devices.get(self.picked)
                if self.picked is not None else None, "buffer_bytes": self.buffer_bytes}


def judge_gdr(pair: Finding, client: CudaInit, server: CudaInit, *, min_bw_fraction: float) -> Finding:
    """The `fabric.gdr` finding of one ib_write_bw --use_cuda pair test, from its `fabric.write_bw` verdict
    and both ends' CUDA lines."""
    d = dict(pair.details)
    d |= {"client_cuda": client.as_dict(), "server_cuda": server.as_dict(), "min_bw_fraction": min_bw_fraction}
    ends = pair.subject
    for side, cuda in (("client", client), ("server", server)):
        node = d.get(side, side)
        if cuda.not_built:
            return replace(pair, check="fabric.gdr", status=Status.FAIL, details=d,
                           message=f"perftest on {node} has no CUDA support: {cuda.not_built}",
                           remedy="build perftest with CUDA (./configure CUDA_H_PATH=/usr/local/cuda/include/cuda.h) "
                                  "or install a package built with it (MLNX_OFED/DOCA perftest)")
        if cuda.mr_failed:
            errno = f" (errno {cuda.mr_errno})" if cuda.mr_errno is not None else ""
            return replace(pair, check="fabric.gdr", status=Status.FAIL, details=d,
                           message=f"GPUDirect RDMA failed on {node} ({ends}): Couldn't allocate MR on GPU "
                                   f"{cuda.picked if cuda.picked is not None else '?'}{errno}", remedy=PEERMEM)
    gbps, link = d.get("bw_average_gbps"), d.get("link_gbps")
    if pair.status is Status.UNKNOWN or gbps is None:
        return replace(pair, check="fabric.gdr", details=d)
    gpu = f"GPU {server.picked} <-> GPU {client.picked}" if server.picked is not None else "GPU memory"
    if link is None:
        return replace(pair, check="fabric.gdr", status=Status.OK, details=d,
                       message=f"GPUDirect write bandwidth {gbps:.1f} Gb/s ({gpu}, {ends}; link rate unknown)")
    target = min_bw_fraction * float(link)
    msg = f"GPUDirect write bandwidth {gbps:.1f} Gb/s ({gpu}, {ends}; target {target:.0f} Gb/s)"
    if gbps >= target:
        return replace(pair, check="fabric.gdr", status=Status.OK, details=d, message=msg, remedy=None)
    status = Status.WARN if gbps >= target / 2 else Status.FAIL
    return replace(pair, check="fabric.gdr", status=status, details=d, message=msg,
                   remedy="the same pair without --use_cuda (check fabric --pingpong) tells NIC from GPU path: if "
                          "host memory is fast, the GPU and the HCA are far apart (nvidia-smi topo -m: SYS/NODE "
                          "instead of PIX/PXB; set fabric.gdr.gpu_for_device to the nearest GPU) or PCIe ACS/IOMMU "
                          "sends peer-to-peer traffic through the root complex")
