"""gpu.nvlink_rate: NVLink error counters growing between audits, judged as DCGM's NVLink health watch
(replay/recovery growth fails, CRC fails at 100/s and warns below); resets and reboots start again; the
audit remembers the counters in --history (stand-in nvidia-smi over real sshd printing the real
`nvlink -e` format of tests/fixtures/nvidia-smi-nvlink, counts mutated between runs)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.findings import Status
from infer_ctl.core.gpu.facts import GpuFacts, NodeGpuFacts, NvLink
from infer_ctl.core.gpu.nvlink_rate import judge_nvlink_rate
from tests.audit.test_audit_e2e import H100, standin_gpu_node

FIX = Path(__file__).parents[1] / "fixtures" / "nvidia-smi-nvlink"
E_REAL = (FIX / "e-stas00-h100-80gb-hbm3-nvlink-e-ELIDED.txt").read_text()


def gpu(replay: int, recovery: int, crc: int) -> GpuFacts:
    links = (NvLink(0, True, None, 0, 0, 0), NvLink(3, True, None, replay, recovery, crc))
    return GpuFacts(index=0, pci_bus_id="00000000:18:00.0", nvlinks=links)


def facts(at: float, boot: float = 1000.0) -> NodeGpuFacts:
    return NodeGpuFacts(source="nvml", gathered_at=at, boot_time=boot)


def test_growth_between_audits_as_dcgm_judges_it() -> None:
    first = judge_nvlink_rate("n1", gpu(0, 0, 10), facts(10_000.0), None)
    assert first is not None and first.status is Status.OK and "needs an earlier audit" in first.message
    mem = first.details["memory"]
    assert mem["links"] == {"0": [0, 0, 0], "3": [0, 0, 10]}
    # CRC +60 in 10 min: far below 100/s: a warning
    crc = judge_nvlink_rate("n1", gpu(0, 0, 70), facts(10_600.0), mem)
    assert crc is not None and crc.status is Status.WARN and crc.message == "NVLink errors grew in 10 min: crc +60 (links 3)"
    # one replay error is a failure (DCGM: replay and recovery errors are failures), with a drain remedy
    rep = judge_nvlink_rate("n1", gpu(1, 0, 10), facts(10_600.0), mem)
    assert rep is not None and rep.status is Status.FAIL and "replay +1" in rep.message and "drain the node" in (rep.remedy or "")
    # CRC at >= 100/s fails too
    storm = judge_nvlink_rate("n1", gpu(0, 0, 10 + 100 * 600), facts(10_600.0), mem)
    assert storm is not None and storm.status is Status.FAIL and storm.details["crc_per_s"] == 100.0
    # no growth, a reset (counter went down), another boot, too short an interval: no failure
    assert judge_nvlink_rate("n1", gpu(0, 0, 10), facts(10_600.0), mem).status is Status.OK  # type: ignore[union-attr]
    assert judge_nvlink_rate("n1", gpu(0, 0, 0), facts(10_600.0), mem).status is Status.OK  # type: ignore[union-attr]
    other_boot = judge_nvlink_rate("n1", gpu(5, 5, 99), facts(10_600.0, boot=9000.0), mem)
    assert other_boot is not None and other_boot.status is Status.OK and "needs an earlier audit" in other_boot.message
    assert judge_nvlink_rate("n1", gpu(5, 0, 0), facts(10_010.0), mem).status is Status.OK  # type: ignore[union-attr]
    # a GPU without error counters says nothing
    assert judge_nvlink_rate("n1", GpuFacts(index=0, pci_bus_id="x", nvlinks=()), facts(1.0), None) is None


def _nvlink_e(replays_on_gpu3_link1: int) -> str:
    """The real capture's per-GPU format (links 0, 1 and 17 shown), for 8 GPUs; one counter mutated."""
    out = []
    for i in range(8):
        text = E_REAL.replace("GPU 0:", f"GPU {i}:").replace("         [...]\n\n", "")
        if i == 3:
            text = text.replace("Link 1: Replay Errors: 0", f"Link 1: Replay Errors: {replays_on_gpu3_link1}")
        out.append(text if text.endswith("\n") else text + "\n")
    return "".join(out)


@pytest.mark.ssh
def test_the_audit_remembers_nvlink_counters(ssh_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ssh_cluster(1, names=["n1"], roles=[["prefill", "decode"]])
    standin_gpu_node(cluster, "n1", H100)
    bin_dir = cluster.bin_dir("n1")
    (bin_dir / "nvlink-e.txt").write_text(_nvlink_e(0))
    script = (bin_dir / "nvidia-smi").read_text().replace('"nvlink -e") : ;;', f'"nvlink -e") cat {bin_dir / "nvlink-e.txt"} ;;')
    (bin_dir / "nvidia-smi").write_text(script)
    profile = cluster.write_profile(tmp_path / "p.yaml", gpu={"expected_count": 8, "facts_source": "nvidia-smi"})
    hist = tmp_path / "h.jsonl"

    def audit() -> dict[str, Any]:
        capsys.readouterr()
        main(["audit", "-p", str(profile), "--json", "--only", "gpu", "--history", str(hist)])
        doc = json.loads(capsys.readouterr().out)
        return {f["subject"]: f for f in doc["findings"] if f["check"] == "gpu.nvlink_rate"}

    first = audit()
    assert set(first) == {f"GPU{i}" for i in range(8)} and {f["status"] for f in first.values()} == {"ok"}
    record = json.loads(hist.read_text().splitlines()[-1])
    assert record["memory"]["gpu.nvlink_rate"]["n1"]["GPU3"]["links"]["1"] == [0, 0, 0]
    # fake the first sample a minute older (the rate needs 30 s), then GPU3 link 1 replays
    lines = hist.read_text().splitlines()
    rec = json.loads(lines[-1])
    for sub in rec["memory"]["gpu.nvlink_rate"]["n1"].values():
        sub["at"] -= 60
    hist.write_text(json.dumps(rec) + "\n")
    (bin_dir / "nvlink-e.txt").write_text(_nvlink_e(4))
    second = audit()
    assert second["GPU3"]["status"] == "fail" and re.search(r"replay \+4 \(links 1\)", second["GPU3"]["message"])
    assert {s for s, f in second.items() if f["status"] != "ok"} == {"GPU3"}
