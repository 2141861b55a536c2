"""Active-diagnostic parsers and judges on real published outputs (tests/fixtures/{dcgmi,nccl-tests,
perftest-cuda}/PROVENANCE.md; FROM-FORMAT files are built from the upstream format strings and say so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core import remediation as rem
from infer_ctl.core.diag.dcgm import judge_dcgm
from infer_ctl.core.diag.gdr import judge_gdr
from infer_ctl.core.diag.nccl import judge_nccl
from infer_ctl.core.fabric.judge import PairRun, Thresholds, judge_pair
from infer_ctl.core.fabric.pairs import Endpoint, PairTest
from infer_ctl.core.findings import Status
from infer_ctl.facts.dcgmi import DcgmOutputError, diag_command, parse_diag
from infer_ctl.facts.nccl_tests import parse_all_reduce
from infer_ctl.facts.perftest_cuda import parse_cuda_init
from infer_ctl.facts.rdma_pingpong import parse_perftest
from infer_ctl.profile.fabric_diag import NcclSettings
from infer_ctl.profile.remediation import RemediationSettings

FIX = Path(__file__).parents[1] / "fixtures"
DCGM = FIX / "dcgmi"
NCCL = FIX / "nccl-tests"
CUDA = FIX / "perftest-cuda"
RDMA_PERFTEST = FIX / "rdma" / "perftest"


# ---- dcgmi diag -j --------------------------------------------------------------------------------------
def test_dcgm_3x_real_output_with_leading_text_and_nulls() -> None:
    text = (DCGM / "dcgm-3.1.0-JsonResultTests-real-output-8gpu-pass.txt").read_text()
    assert text.startswith("\tWARNING: THIS SHOULD NOT HAPPEN")  # dcgmi printed a line before the JSON
    diag = parse_diag(text)
    assert diag.version == "3.1.0" and diag.runtime_error is None
    # 9 deployment tests once for all 8 GPUs (the `null` entries between them skipped) + software per GPU
    deploy = [r for r in diag.results if r.category == "Deployment"]
    assert [r.test for r in deploy] == ["Denylist", "NVML Library", "CUDA Main Library",
                                        "Permissions and OS-related Blocks", "Persistence Mode",
                                        "Environmental Variables", "Page Retirement/Row Remap",
                                        "Graphics Processes", "Inforom"]
    assert {r.subject for r in deploy} == {"node"} and {r.status for r in diag.results} == {"pass"}
    assert [r.subject for r in diag.results if r.test == "software"] == [f"GPU{i}" for i in range(8)]
    findings = judge_dcgm("n1", diag, 1)
    assert len(findings) == 17 and {f.status for f in findings} == {Status.OK} and {f.check for f in findings} == {"gpu.diag"}


def test_dcgm_4x_per_gpu_failure_and_severity_remedies() -> None:
    diag = parse_diag((DCGM / "FROM-FORMAT-dcgm-4-diag-r2-gpu1-memory-fail.json").read_text())
    assert diag.version == "4.2.3" and diag.driver == "570.148.08" and diag.serials["GPU1"] == "1652023000001"
    by = {(f.subject, f.details["test"]): f for f in judge_dcgm("dc-01", diag, 2)}
    mem = by[("GPU1", "memory")]
    assert mem.status is Status.FAIL and mem.message.startswith("memory (Hardware, level 2): fail: Found 1 faulty memory")
    assert mem.details["warnings"][0] == {"message": mem.details["warnings"][0]["message"], "error_id": 52,
                                          "category": 10, "severity": "isolate"}
    assert mem.details["action"] == "drain" and mem.details["serial"] == "1652023000001"
    assert "drain the node" in (mem.remedy or "") and "--diag 2 -n dc-01" in (mem.remedy or "")
    # DCGM_ERROR_CONFIG (persistence mode off) warns with a configuration remedy and never drains
    sw = by[("GPU0", "software")]
    assert sw.status is Status.WARN and "action" not in sw.details and "configuration" in (sw.remedy or "")
    assert by[("GPU2", "memory")].status is Status.OK and by[("GPU3", "pcie")].status is Status.OK
    # audit --remediate reads the FAIL as "drain" (details.action), the WARN not
    policy = RemediationSettings(enabled=True)
    assert rem.says_drain(mem, policy) and not rem.says_drain(sw, policy)


def test_dcgm_runtime_error_and_garbage() -> None:
    diag = parse_diag((DCGM / "FROM-FORMAT-dcgm-4-runtime-error-nvvs.json").read_text())
    (f,) = judge_dcgm("n1", diag, 3)
    assert f.status is Status.UNKNOWN and "Return: (-30) : DCGM GPU Diagnostic returned an error" in f.message
    assert "nv-hostengine" in (f.remedy or "")
    with pytest.raises(DcgmOutputError, match="Unable to connect to host engine"):
        parse_diag("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
    with pytest.raises(DcgmOutputError, match="no valid JSON"):
        parse_diag('{"DCGM Diagnostic": {"test_categories": [')
    # a 3.x mixed case: a failing test with a bare warning string, no severity: Hardware drains
    doc = ('{"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": "GPU Memory",'
           ' "results": [{"gpu_ids": "0", "status": "FAIL", "warnings": ["GPU 0 Error using CUDA API cuCtxCreate"]}]}]}],'
           ' "version": "3.3.1"}}')
    (f,) = judge_dcgm("n1", parse_diag(doc), 2)
    assert f.subject == "GPU0" and f.status is Status.FAIL and f.details["action"] == "drain"


def test_diag_command_is_bounded_on_the_node() -> None:
    assert list(diag_command(2).argv) == ["timeout", "-k", "10", "900", "dcgmi", "diag", "-r", "2", "-j"]
    assert list(diag_command(1, timeout_s=42).argv)[3] == "42"


# ---- nccl-tests all_reduce_perf --------------------------------------------------------------------------
def test_nccl_real_two_node_run() -> None:
    run = parse_all_reduce((NCCL / "a3mega-all_reduce_perf-2node-16xh100-mpirun-8-8G.txt").read_text())
    assert len(run.ranks) == 16 and run.hosts == ["ztan-mig-235z", "ztan-mig-gq73"]
    assert run.ranks[15].gpu == "NVIDIA H100 80GB HBM3" and run.ranks[15].device == 7
    assert len(run.rows) == 31 and run.out_of_bounds == 0 and run.avg_busbw == 70.742 and not run.errors
    peak = run.peak
    assert peak is not None and peak.size_bytes == 8589934592 and peak.oop_busbw == 338.82 and peak.ip_busbw == 337.35
    # judged on the 8 GiB row, not on the sweep's average (70.7)
    ok = judge_nccl("a+b", "a", run, NcclSettings(min_busbw_gbs=320), exit_code=0, expected_ranks=16)
    assert ok.status is Status.OK and ok.message == "all_reduce busbw 338.8 GB/s at 8 GiB over 16 ranks (expected 320)"
    warn = judge_nccl("a+b", "a", run, NcclSettings(min_busbw_gbs=360), exit_code=0)
    fail = judge_nccl("a+b", "a", run, NcclSettings(min_busbw_gbs=400), exit_code=0)
    assert warn.status is Status.WARN and fail.status is Status.FAIL and "bisect" in (fail.remedy or "")
    assert judge_nccl("a+b", "a", run, NcclSettings(), exit_code=0).status is Status.OK
    short = judge_nccl("a+b", "a", run, NcclSettings(min_busbw_gbs=300), exit_code=0, expected_ranks=24)
    assert short.status is Status.FAIL and "16 ranks, expected 24" in short.message


def test_nccl_mpirun_tag_output_prefix_and_old_columns() -> None:
    text = (NCCL / "a3mega-all_reduce_perf-2node-16xh100-mpirun-8-8G.txt").read_text()
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in text.splitlines())  # mpirun --tag-output
    assert parse_all_reduce(tagged).peak == parse_all_reduce(text).peak
    # nccl-tests before `root`/`#wrong` (the header of NVIDIA/nccl issue #583): columns found by name
    old = ("#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
           "  8589934592    2147483648   float     sum    82000  104.75  183.31  5e-07    82010  104.74  183.30  5e-07\n")
    (row,) = parse_all_reduce(old).rows
    assert row.oop_busbw == 183.31 and row.ip_busbw == 183.30 and row.redop == "sum"


def test_nccl_failures() -> None:
    err = parse_all_reduce((NCCL / "FROM-FORMAT-all_reduce_perf-2node-nccl-system-error.txt").read_text())
    f = judge_nccl("pf-01+dc-01", "pf-01", err, NcclSettings(min_busbw_gbs=40), exit_code=1)
    assert f.status is Status.FAIL and "Test NCCL failure common.cu:1279 'unhandled system error" in f.message
    assert "NCCL_IB_HCA" in (f.remedy or "")
    wrong = parse_all_reduce((NCCL / "FROM-FORMAT-all_reduce_perf-2node-wrong-results.txt").read_text())
    f = judge_nccl("pf-01+dc-01", "pf-01", wrong, NcclSettings(min_busbw_gbs=20), exit_code=0)
    assert f.status is Status.FAIL and f.message == "all_reduce_perf returned wrong results (3 wrong values)"
    assert judge_nccl("x", "x", None, NcclSettings(), exit_code=127, error="mpirun is not installed").status is Status.UNKNOWN


# ---- perftest --use_cuda (GPUDirect RDMA) ----------------------------------------------------------------
def _pair(tool: str = "ib_write_bw") -> PairRun:
    t = PairTest(Endpoint("pf-01", "10.0.0.1", "mlx5_0", 3, cuda_device=0),
                 Endpoint("dc-01", "10.0.0.2", "mlx5_0", 3, cuda_device=0), 18515, 0)
    return PairRun(t, tool, True, 0, "", 0, "")


def _gdr(client: str, server: str, *, client_exit: int = 0, link: float | None = 200.0, fraction: float = 0.75):
    run = _pair()
    run.client_text, run.server_text, run.client_exit = client, server, client_exit
    base = judge_pair(run, parse_perftest(client), parse_perftest(server), Thresholds(6.0, fraction, link))
    return judge_gdr(base, parse_cuda_init(client), parse_cuda_init(server), min_bw_fraction=fraction)


def test_gdr_real_a40_run_and_its_target() -> None:
    client = (RDMA_PERFTEST / "schmaustech-ib_write_bw-client-roce-a40-gpudirect-16qp-D60.txt").read_text()
    server = (RDMA_PERFTEST / "schmaustech-ib_write_bw-server-roce-a40-gpudirect-16qp-D60.txt").read_text()
    cuda = parse_cuda_init(client)
    assert cuda.initialized and cuda.picked == 0 and cuda.gpu_name == "NVIDIA A40" and cuda.devices == {0: "E1:00"}
    assert cuda.buffer_bytes == 2097152 and not cuda.mr_failed
    f = _gdr(client, server)
    assert f.check == "fabric.gdr" and f.status is Status.OK
    assert f.message.startswith("GPUDirect write bandwidth 181.5 Gb/s (GPU 0 <-> GPU 0")
    assert f.details["client_cuda"] == {"gpu": 0, "gpu_name": "NVIDIA A40", "gpu_pci": "E1:00", "buffer_bytes": 2097152}
    # the same 181 Gb/s on a 400G link misses 0.75 x 400 (and is above half of it: a warning)
    slow = _gdr(client, server, link=400.0)
    assert slow.status is Status.WARN and "target 300 Gb/s" in slow.message and "nvidia-smi topo -m" in (slow.remedy or "")


def test_gdr_couldnt_allocate_mr_means_no_peermem() -> None:
    client = (CUDA / "perftest-issue126-ib_write_bw-client-use_cuda-a30-couldnt-allocate-MR.txt").read_text()
    server = (CUDA / "perftest-issue126-ib_write_bw-server-use_cuda-waiting.txt").read_text()
    cuda = parse_cuda_init(client)
    assert cuda.gpu_name == "NVIDIA A30-8C" and cuda.mr_failed and cuda.buffer_bytes == 262144
    f = _gdr(client, server, client_exit=139)
    assert f.check == "fabric.gdr" and f.status is Status.FAIL
    assert f.message == "GPUDirect RDMA failed on dc-01 (pf-01/mlx5_0 <-> dc-01/mlx5_0): Couldn't allocate MR on GPU 0"
    assert "nvidia-peermem" in (f.remedy or "")
    # the 2018 server side (K80, 'picking first' wording): the same verdict from the server's lines
    k80 = (CUDA / "perftest-issue31-ib_write_bw-server-use_cuda-k80-couldnt-allocate-MR.txt").read_text()
    assert parse_cuda_init(k80).gpu_name == "Tesla K80" and parse_cuda_init(k80).picked == 0
    f = _gdr("", k80, client_exit=1)
    assert f.status is Status.FAIL and "failed on pf-01" in f.message


def test_gdr_perftest_without_cuda() -> None:
    text = "ib_write_bw: unrecognized option '--use_cuda=0'\n Invalid Command or flag.\n"
    f = _gdr(text, "", client_exit=1)
    assert f.status is Status.FAIL and "has no CUDA support" in f.message and "CUDA_H_PATH" in (f.remedy or "")
