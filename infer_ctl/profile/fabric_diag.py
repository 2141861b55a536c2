"""Expectations of the active fabric diagnostics: `check fabric --gdr` (perftest with GPU memory) and
`check fabric --nccl` (nccl-tests all_reduce_perf). Neither runs in the default audit."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from infer_ctl.profile.base import StrictModel


class GdrSettings(StrictModel):
    #: ib_write_bw with --use_cuda must reach this fraction of the slower link rate
    min_bw_fraction: Annotated[float, Field(gt=0, le=1)] = 0.75
    #: which GPU (CUDA index) each HCA reads from and writes to; unset devices use their rail position
    #: (the i-th tested HCA of a node uses GPU i: rail-aligned HGX boards put NIC i next to GPU i)
    gpu_for_device: dict[str, Annotated[int, Field(ge=0, le=63)]] = Field(default_factory=dict)
    #: ib_write_bw iterations of 64 KiB (at least 5000, as the ordinary bandwidth pair test)
    iters: Annotated[int, Field(ge=1)] = 5000


class NcclSettings(StrictModel):
    #: the expected all_reduce bus bandwidth (GB/s, nccl-tests' busbw) at the largest message size;
    #: None: report it, judge only errors and wrong results
    min_busbw_gbs: Annotated[float, Field(gt=0)] | None = None
    #: within this fraction below min_busbw_gbs it is a WARN, further below a FAIL
    warn_margin: Annotated[float, Field(ge=0, lt=1)] = 0.1
    #: how the ranks start: `mpirun` on the first selected node (Open MPI, passwordless SSH between the
    #: nodes, all_reduce_perf built with MPI=1), or `single` (one process per node, -g GPUs, no MPI:
    #: NVLink inside each node only)
    launcher: Literal["mpirun", "single"] = "mpirun"
    #: the all_reduce_perf binary on the nodes
    binary: str = "all_reduce_perf"
    mpirun: str = "mpirun"
    #: GPUs per node (-npernode for mpirun, -g for single); unset: the node's `gpus`
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] | None = None
    min_bytes: str = "1G"
    max_bytes: str = "8G"
    #: extra mpirun arguments (e.g. ["-x", "NCCL_IB_HCA=mlx5", "--mca", "btl_tcp_if_include", "eth0"])
    mpirun_args: list[str] = Field(default_factory=list)
    timeout_s: Annotated[float, Field(gt=0)] = 600.0
