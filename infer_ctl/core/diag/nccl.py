"""nccl-tests `all_reduce_perf`: rows and summary, judged into `fabric.nccl` findings.

The bus bandwidth judged is the out-of-place busbw of the largest message size: nccl-tests' own
`# Avg bus bandwidth` averages every size of the sweep, small ones included (70.7 GB/s on a real
2 x 8 H100 run whose 8 GiB row reaches 338.8 GB/s, tests/fixtures/nccl-tests/), so it says more about
the chosen -b than about the fabric. busbw is nccl-tests' "bus bandwidth" (algbw x 2(n-1)/n for
all-reduce; nccl-tests doc/PERFORMANCE.md), comparable across rank counts. Wrong results (`#wrong`,
"Out of bounds values : N FAILED") fail whatever the bandwidth: the reduction was corrupted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infer_ctl.core.findings import Finding
from infer_ctl.profile.fabric_diag import NcclSettings


@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None
    ip_time_us: float | None = None
    ip_algbw: float | None = None
    ip_busbw: float | None = None
    ip_wrong: int | None = None


@dataclass(frozen=True)
class NcclRank:
    rank: int
    host: str
    device: int
    gpu: str


@dataclass
class NcclRun:
    ranks: list[NcclRank] = field(default_factory=list)
    rows: list[NcclRow] = field(default_factory=list)
    out_of_bounds: int | None = None
    avg_busbw: float | None = None
    errors: list[str] = field(default_factory=list)
    header: str | None = None

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(r.host for r in self.ranks))

    @property
    def peak(self) -> NcclRow | None:
        """The row of the largest message size (the bandwidth plateau)."""
        return max(self.rows, key=lambda r: r.size_bytes) if self.rows else None


def judge_nccl(subject: str, node: str, run: NcclRun | None, policy: NcclSettings, *, exit_code: int | None,
               error: str | None = None, expected_ranks: int | None = None) -> Finding:
    """One finding for one all_reduce_perf run; `subject` names the node set (e.g. `pf-01+dc-01`)."""
    base: dict[str, object] = {"exit_code": exit_code, "launcher": policy.launcher,
                               "min_busbw_gbs": policy.min_busbw_gbs}
    if run is None or error:
        return Finding.unknown("fabric.nccl", node, subject, f"all_reduce_perf did not run: {error or 'no output'}",
                               details=base, remedy=_setup_remedy(policy))
    peak = run.peak
    base |= {"ranks": len(run.ranks), "hosts": run.hosts, "avg_busbw_gbs": run.avg_busbw,
             "out_of_bounds": run.out_of_bounds, "errors": run.errors[:5],
             "peak": None if peak is None else {"size_bytes": peak.size_bytes, "busbw_gbs": peak.oop_busbw,
                                                 "algbw_gbs": peak.oop_algbw, "time_us": peak.oop_time_us}}
    # nccl-tests' "Out of bounds values" is the total of the rows' #wrong columns
    wrong = max(run.out_of_bounds or 0, sum((r.oop_wrong or 0) + (r.ip_wrong or 0) for r in run.rows))
    if run.errors and not run.rows:
        return Finding.fail("fabric.nccl", node, subject, f"all_reduce_perf failed: {run.errors[0]}", details=base,
                            remedy="rerun with NCCL_DEBUG=INFO (fabric.nccl.mpirun_args: [-x, NCCL_DEBUG=INFO]) "
                                   "and read the first WARN; 'unhandled system error' is mostly the RDMA device or "
                                   "GID (NCCL_IB_HCA, NCCL_IB_GID_INDEX) or a firewall between the nodes")
    if wrong:
        return Finding.fail("fabric.nccl", node, subject,
                            f"all_reduce_perf returned wrong results ({wrong} wrong values)", details=base,
                            remedy="corrupted reductions: run `check gpu --diag 2` on these nodes, check ECC/XIDs "
                                   "and the NVLink/PCIe counters; exclude nodes one by one to find the bad one")
    if peak is None:
        return Finding.fail("fabric.nccl", node, subject, f"all_reduce_perf printed no result row (exit {exit_code})",
                            details=base, remedy=_setup_remedy(policy))
    if expected_ranks is not None and run.ranks and len(run.ranks) != expected_ranks:
        return Finding.fail("fabric.nccl", node, subject,
                            f"all_reduce_perf ran {len(run.ranks)} ranks, expected {expected_ranks}", details=base,
                            remedy="check the hostfile/slots mpirun used and fabric.nccl.gpus_per_node")
    size = _size(peak.size_bytes)
    text = f"all_reduce busbw {peak.oop_busbw:.1f} GB/s at {size} over {len(run.ranks) or '?'} ranks"
    floor = policy.min_busbw_gbs
    if floor is None:
        return Finding.ok("fabric.nccl", node, subject, text + " (no fabric.nccl.min_busbw_gbs to judge it)",
                          details=base)
    text += f" (expected {floor:g})"
    if peak.oop_busbw >= floor:
        return Finding.ok("fabric.nccl", node, subject, text, details=base)
    slow = ("check every node's NIC rate and PCIe (check fabric), GPUDirect RDMA (check fabric --gdr: a node "
            "without nvidia-peermem falls back to host copies), NCCL_IB_HCA/NCCL_IB_GID_INDEX and PFC pauses; "
            "bisect the node set to find the slow pair")
    if peak.oop_busbw >= floor * (1 - policy.warn_margin):
        return Finding.warn("fabric.nccl", node, subject, text, details=base, remedy=slow)
    return Finding.fail("fabric.nccl", node, subject, text, details=base, remedy=slow)


def _setup_remedy(policy: NcclSettings) -> str:
    if policy.launcher == "mpirun":
        return (f"install nccl-tests built with MPI=1 ({policy.binary}) and Open MPI ({policy.mpirun}) on every "
                "node, with passwordless SSH between them; or set fabric.nccl.launcher: single")
    return f"install nccl-tests ({policy.binary}) on every node (make CUDA_HOME=... NCCL_HOME=...)"


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"
