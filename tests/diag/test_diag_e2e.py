"""Active diagnostics end to end over real sshd nodes (tests/sshd_harness.py): `check gpu --diag`,
`check fabric --gdr` and `check fabric --nccl` through the CLI.

Real: sshd, the SSH fleet, the node's `timeout` around each tool, the pair-test orchestration (detached
server, readiness on /proc/net/tcp, client, collection), TCP between the nodes, the CLI and the parsers.
Stand-ins on the nodes' PATH: dcgmi, mpirun and all_reduce_perf print real captures (tests/fixtures/
{dcgmi,nccl-tests}/) and record their argv; ib_write_bw is tests/diag/standins/standin-perftest-cuda over
the fabric stand-in (tests/fabric/standins)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from tests.audit.test_audit_e2e import H100, standin_gpu_node
from tests.fabric.cluster_setup import FabricNode, fabric_profile, free_port_range, leftovers, setup_node

pytestmark = pytest.mark.ssh

FIX = Path(__file__).parents[1] / "fixtures"
STANDINS = Path(__file__).parent / "standins"


def _recording(cluster: Any, node: str, tool: str, output: Path | str, code: int = 0) -> None:
    """A stand-in that records its argv (one line per run) and prints a capture."""
    bin_dir = cluster.bin_dir(node)
    text = output.read_text() if isinstance(output, Path) else output
    (bin_dir / f"{tool}.out").write_text(text)
    cluster.add_executable(node, tool, f'printf "%s\\n" "$*" >> {bin_dir / (tool + ".argv")}\n'
                                       f"cat {bin_dir / (tool + '.out')}\nexit {code}\n")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(list(args))
    return rc, json.loads(capsys.readouterr().out)


def test_check_gpu_diag_judges_dcgm_per_test_and_gpu(ssh_cluster, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cluster = ssh_cluster(3, names=["n1", "n2", "n3"], roles=[["prefill"], ["decode"], ["decode"]])
    for n in ("n1", "n2", "n3"):
        standin_gpu_node(cluster, n, H100)
    # n1: DCGM 4 fails GPU1's memory test (dcgmi exits non-zero then: 226 is DCGM_ST_NVVS_ERROR as unsigned)
    _recording(cluster, "n1", "dcgmi", FIX / "dcgmi" / "FROM-FORMAT-dcgm-4-diag-r2-gpu1-memory-fail.json", code=226)
    # n2: DCGM 3.1's real output, a line of text before the JSON, all passing
    _recording(cluster, "n2", "dcgmi", FIX / "dcgmi" / "dcgm-3.1.0-JsonResultTests-real-output-8gpu-pass.txt")
    # n3: no dcgmi installed (and no host engine)
    profile = cluster.write_profile(tmp_path / "p.yaml", gpu={"expected_count": 8})
    rc, doc = _run(capsys, "check", "gpu", "-p", str(profile), "--json", "--diag", "2", "--diag-timeout", "120")
    assert rc == 2
    diag = {(f["node"], f["subject"], f["details"].get("test")): f for f in doc["findings"] if f["check"] == "gpu.diag"}
    mem = diag[("n1", "GPU1", "memory")]
    assert mem["status"] == "fail" and mem["code"] and mem["details"]["action"] == "drain"
    assert "Found 1 faulty memory elements on GPU 1" in mem["message"] and "drain the node" in mem["remedy"]
    assert diag[("n1", "GPU0", "software")]["status"] == "warn"
    n2 = [f for k, f in diag.items() if k[0] == "n2"]
    assert len(n2) == 17 and {f["status"] for f in n2} == {"ok"}
    gone = diag[("n3", "node", None)]
    assert gone["status"] == "unknown" and "dcgmi is not installed" in gone["message"]
    assert "datacenter-gpu-manager" in gone["remedy"]
    # the node ran exactly dcgmi diag -r 2 -j, under the node's timeout with --diag-timeout
    assert (cluster.bin_dir("n1") / "dcgmi.argv").read_text() == "diag -r 2 -j\n"
    # the ordinary GPU checks still ran next to it
    assert any(f["check"] == "gpu.count" and f["node"] == "n1" for f in doc["findings"])
    # without --diag, dcgmi is never called
    rc, doc = _run(capsys, "check", "gpu", "-p", str(profile), "--json", "-n", "n2")
    assert rc == 0 and not [f for f in doc["findings"] if f["check"] == "gpu.diag"]
    assert (cluster.bin_dir("n2") / "dcgmi.argv").read_text().count("\n") == 1


def _nccl_profile(cluster: Any, tmp_path: Path, sysfs: Path, **nccl: Any) -> Path:
    path = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range(), nccl=nccl)
    return path


def test_check_fabric_nccl_mpirun_and_single(ssh_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cluster = ssh_cluster(2, names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    for n, ip in (("pf-01", "10.0.0.11"), ("dc-01", "10.0.0.21")):
        setup_node(cluster, sysfs, n, FabricNode(ipv4=ip))
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    real = FIX / "nccl-tests" / "a3mega-all_reduce_perf-2node-16xh100-mpirun-8-8G.txt"
    _recording(cluster, "pf-01", "mpirun", real)
    profile = _nccl_profile(cluster, tmp_path, sysfs, min_busbw_gbs=320, gpus_per_node=8,
                            mpirun_args=["-x", "NCCL_IB_HCA=mlx5"])
    rc, doc = _run(capsys, "check", "fabric", "-p", str(profile), "--json", "--nccl")
    (f,) = [x for x in doc["findings"] if x["check"] == "fabric.nccl"]
    assert f["status"] == "ok" and f["node"] == "pf-01" and f["subject"] == "pf-01+dc-01"
    assert f["message"] == "all_reduce busbw 338.8 GB/s at 8 GiB over 16 ranks (expected 320)"
    assert f["details"]["avg_busbw_gbs"] == 70.742 and f["details"]["hosts"] == ["ztan-mig-235z", "ztan-mig-gq73"]
    # one mpirun, on the first node, with both nodes' GPUs as slots
    hosts = f"{cluster.node('pf-01').host}:8,{cluster.node('dc-01').host}:8"
    assert (cluster.bin_dir("pf-01") / "mpirun.argv").read_text() == (
        f"--allow-run-as-root -np 16 -H {hosts} --bind-to none -x NCCL_IB_HCA=mlx5 "
        "all_reduce_perf -b 1G -e 8G -f 2 -g 1\n")
    assert not (cluster.bin_dir("dc-01") / "mpirun.argv").exists()
    # a slower fabric than the profile expects fails with the bisecting remedy
    profile = _nccl_profile(cluster, tmp_path, sysfs, min_busbw_gbs=400, gpus_per_node=8)
    rc, doc = _run(capsys, "check", "fabric", "-p", str(profile), "--json", "--nccl")
    (f,) = [x for x in doc["findings"] if x["check"] == "fabric.nccl"]
    assert rc == 2 and f["status"] == "fail" and "bisect" in f["remedy"]
    # launcher single: all_reduce_perf -g N on each node, no MPI; a node without the binary is UNKNOWN
    _recording(cluster, "pf-01", "all_reduce_perf", real)
    profile = _nccl_profile(cluster, tmp_path, sysfs, launcher="single", gpus_per_node=8, min_bytes="1M")
    rc, doc = _run(capsys, "check", "fabric", "-p", str(profile), "--json", "--nccl")
    by = {x["node"]: x for x in doc["findings"] if x["check"] == "fabric.nccl"}
    assert by["pf-01"]["status"] == "fail" and "ran 16 ranks, expected 8" in by["pf-01"]["message"]
    assert (cluster.bin_dir("pf-01") / "all_reduce_perf.argv").read_text() == "-b 1M -e 8G -f 2 -g 8\n"
    assert by["dc-01"]["status"] == "unknown" and "all_reduce_perf is not installed on dc-01" in by["dc-01"]["message"]


def _cuda_node(cluster: Any, node: str, mode: str = "ok") -> None:
    bin_dir = cluster.bin_dir(node)
    (bin_dir / "ib_write_bw.base").write_text((bin_dir / "ib_write_bw").read_text())  # the fabric stand-in
    text = (STANDINS / "standin-perftest-cuda").read_text()
    (bin_dir / "ib_write_bw").write_text(f"#!{sys.executable}\n" + text.split("\n", 1)[1])
    (bin_dir / "ib_write_bw").chmod(0o755)
    gpus = {str(i): ["NVIDIA H100 80GB HBM3", pci] for i, pci in enumerate(["18:00", "2a:00", "3a:00", "5d:00"])}
    (bin_dir / "standin-cuda.json").write_text(json.dumps({"gpus": gpus, "mode": mode}))


def test_check_fabric_gdr_between_prefill_and_decode(ssh_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cluster = ssh_cluster(3, names=["pf-01", "dc-01", "dc-02"], roles=[["prefill"], ["decode"], ["decode"]])
    sysfs = tmp_path / "sysfs"
    for n in ("pf-01", "dc-01", "dc-02"):  # the RoCE GID's IPv4 is the node's own (loopback) address
        setup_node(cluster, sysfs, n, FabricNode(ipv4=cluster.node(n).host))
    _cuda_node(cluster, "pf-01")
    _cuda_node(cluster, "dc-01")
    _cuda_node(cluster, "dc-02", mode="no-peermem")
    monkeypatch.setenv("INFERCTL_SYSFS_ROOT", str(sysfs / "{node}"))
    # loopback TCP is far from 400 Gb/s: a tiny fraction passes the healthy pair, the pair through dc-02 fails
    profile = fabric_profile(cluster, tmp_path / "p.yaml", free_port_range(),
                             gdr={"min_bw_fraction": 0.0001, "iters": 200, "gpu_for_device": {"mlx5_0": 3}})
    rc, doc = _run(capsys, "check", "fabric", "-p", str(profile), "--json", "--gdr")
    gdr = {f["details"]["client"]: f for f in doc["findings"] if f["check"] == "fabric.gdr"}
    assert set(gdr) == {"dc-01", "dc-02"} and rc == 2
    ok = gdr["dc-01"]
    assert ok["status"] == "ok" and ok["message"].startswith("GPUDirect write bandwidth ") and ok["code"]
    assert ok["details"]["client_cuda"]["gpu"] == 3 and ok["details"]["server_cuda"]["gpu_pci"] == "5d:00"
    bad = gdr["dc-02"]
    assert bad["status"] == "fail" and "Couldn't allocate MR on GPU 3" in bad["message"] and "failed on dc-02" in bad["message"]
    assert "nvidia-peermem" in bad["remedy"]
    # both ends got --use_cuda with the GPU of their HCA; no other pair test ran
    for node in ("pf-01", "dc-01"):
        runs = (cluster.bin_dir(node) / "ib_write_bw.cuda-args").read_text().splitlines()
        assert runs and all("--use_cuda=3" in r and "--report_gbits" in r for r in runs)
    assert not (cluster.bin_dir("pf-01") / "ibv_rc_pingpong.args").exists()
    assert {(c["server"], c["client"], c["status"]) for c in doc["gdr"]["cells"]} == {
        ("pf-01", "dc-01", "ok"), ("pf-01", "dc-02", "fail")}
    assert leftovers(tmp_path) == []  # the servers were collected, also the one whose client failed
