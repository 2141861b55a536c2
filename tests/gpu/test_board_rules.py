"""The passive GPU checks that used to pass silently: NVSwitch fabric state, power
limit, HBM temperature, InfoROM, VBIOS per node and per fleet, the PCIe replay rate between audits, and
a driver split without a majority. Facts come from real nvidia-smi captures (tests/fixtures/nvidia-smi-qx,
one HAND-EDITED copy with one fault per GPU, named so) or are changed by hand on top of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ctl.core.findings import Status
from infer_ctl.core.gpu import rules
from infer_ctl.core.gpu.board import (
    judge_fabric,
    judge_inforom,
    judge_memory_temp,
    judge_power_limit,
    judge_vbios,
)
from infer_ctl.core.gpu.facts import NodeGpuFacts
from infer_ctl.core.gpu.fleet import judge_driver_consistency, judge_vbios_consistency
from infer_ctl.core.gpu.replay import expected_rate, judge_pcie_replay
from infer_ctl.facts.nvidia_smi import parse_nvidia_smi_xml

QX = Path(__file__).parents[1] / "fixtures" / "nvidia-smi-qx"
P = rules.GpuPolicy()
H100 = parse_nvidia_smi_xml((QX / "k8stestinfra-h100x8-580.105.08.xml").read_text())
FAULTS = parse_nvidia_smi_xml((QX / "HAND-EDITED-h100x8-580.105.08-fabric-power-hbm-vbios.xml").read_text())
A100 = parse_nvidia_smi_xml((QX / "k8stestinfra-a100-sxm4-40gb-lambda-570.148.08.xml").read_text())
BOOT = 1_800_000_000.0


def _node(doc, *, uptime: float = 3600.0) -> NodeGpuFacts:  # type: ignore[no-untyped-def]
    return NodeGpuFacts(source="nvidia-smi", driver_version=doc.driver_version, cuda_version=doc.cuda_version,
                        gpu_count=len(doc.gpus), gpus=doc.gpus, xids=(), sxids=(), boot_time=BOOT,
                        gathered_at=BOOT + uptime)


def _of(findings, check: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    return {f.subject: f for f in findings if f.check == check}


def test_a_real_healthy_h100_capture_passes_every_new_check() -> None:
    findings = rules.judge_node("n1", _node(H100), P, 8)
    for check in ("gpu.fabric", "gpu.power_limit", "gpu.memory_temp", "gpu.pcie_replay"):
        got = _of(findings, check)
        assert len(got) == 8 and all(f.status is Status.OK for f in got.values()), (check, got)
    assert _of(findings, "gpu.vbios")["node"].message == "VBIOS 96.00.99.00.01 on every NVIDIA H100 80GB HBM3"
    assert "gpu.inforom" not in {f.check for f in findings}  # nvidia-smi printed no infoROM warning: not judged


def test_the_hand_edited_capture_fails_where_it_was_edited() -> None:
    findings = rules.judge_node("n1", _node(FAULTS, uptime=60), P, 8)
    fabric = _of(findings, "gpu.fabric")
    assert fabric["GPU1"].status is Status.WARN and "CUDA fails" in fabric["GPU1"].message
    assert {s for s, f in fabric.items() if f.status is not Status.OK} == {"GPU1"}
    power = _of(findings, "gpu.power_limit")
    assert power["GPU2"].status is Status.WARN and "500 W, below the default 700 W" in power["GPU2"].message
    assert "nvidia-smi -i 2 -pl 700" in (power["GPU2"].remedy or "")
    hbm = _of(findings, "gpu.memory_temp")
    assert hbm["GPU4"].status is Status.FAIL and "profile's gpu.max_memory_temp_c (95 C)" in hbm["GPU4"].message
    (vbios,) = _of(findings, "gpu.vbios").values()
    assert vbios.status is Status.WARN and "96.00.74.00.01 on GPU6" in vbios.message
    # stuck: long after boot, still in progress
    stuck = _of(rules.judge_node("n1", _node(FAULTS, uptime=3600), P, 8), "gpu.fabric")["GPU1"]
    assert stuck.status is Status.FAIL and "stuck in progress" in stuck.message and "fabricmanager" in (stuck.remedy or "")


@pytest.mark.parametrize(("state", "status", "expected"), [
    ("completed", "success", Status.OK), ("completed", "nvml_error_unknown", Status.FAIL),
    ("not_started", None, Status.FAIL), ("in_progress", None, Status.WARN),
])
def test_fabric_states_follow_dcgm(state: str, status: str | None, expected: Status) -> None:
    gpu = H100.gpus[0].with_(fabric_state=state, fabric_status=status)
    (f,) = judge_fabric("n1", NodeGpuFacts(source="nvml", gpus=(gpu,), boot_time=BOOT, gathered_at=BOOT + 60))
    assert f.status is expected and (f.remedy is not None) == (expected is not Status.OK)
    assert judge_fabric("n1", NodeGpuFacts(source="nvml", gpus=A100.gpus)) == []  # no fabric: nothing to say


def test_power_limit_fraction_and_unknowns() -> None:
    gpu = H100.gpus[0].with_(power_limit_w=560.0)
    assert judge_power_limit("n1", gpu, P).status is Status.WARN  # type: ignore[union-attr]
    assert judge_power_limit("n1", gpu, P.model_copy(update={"min_power_limit_fraction": 0.8})).status is Status.OK  # type: ignore[union-attr]
    assert judge_power_limit("n1", gpu.with_(default_power_limit_w=None), P) is None


def test_hbm_temperature_uses_the_gpus_own_limit_when_it_has_one() -> None:
    a100 = A100.gpus[0]  # reports gpu_temp_max_mem_threshold 95 C, memory 34 C
    f = judge_memory_temp("n1", a100, P)
    assert f is not None and f.status is Status.OK and f.details["limit_from"] == "gpu"
    f = judge_memory_temp("n1", a100.with_(mem_temp_c=91, mem_max_temp_c=92), P)
    assert f is not None and f.status is Status.WARN and "the GPU's limit (92 C)" in f.message
    assert judge_memory_temp("n1", a100.with_(mem_temp_c=None), P) is None


def test_inforom() -> None:
    assert judge_inforom("n1", H100.gpus[0]) is None
    bad = judge_inforom("n1", H100.gpus[0].with_(inforom_valid=False))
    assert bad is not None and bad.status is Status.WARN and "InfoROM corrupted" in bad.message
    text = (QX / "k8stestinfra-h100x8-580.105.08.xml").read_text() + "WARNING: infoROM is corrupted at gpu 0000:75:00.0\n"
    doc = parse_nvidia_smi_xml(text)
    assert [g.index for g in doc.gpus if g.inforom_valid is False] == [2] and doc.inforom_corrupted == ("0000:75:00.0",)


def test_vbios_across_the_fleet_and_a_split_without_majority() -> None:
    model = "NVIDIA H100 80GB HBM3"
    out = judge_vbios_consistency({"a": {model: "96.00.99.00.01"}, "b": {model: "96.00.99.00.01"},
                                   "c": {model: "96.00.74.00.01"}})
    assert {f.node: f.status for f in out} == {"a": Status.OK, "b": Status.OK, "c": Status.WARN}
    (split,) = judge_vbios_consistency({"a": {model: "96.00.99.00.01"}, "b": {model: "96.00.74.00.01"}})
    assert split.node == "fleet" and split.status is Status.WARN and "no majority" in split.message
    assert "96.00.74.00.01 on b" in split.message and "96.00.99.00.01 on a" in split.message


def test_a_one_to_one_driver_split_blames_no_node() -> None:
    (split,) = judge_driver_consistency({"a": ("550.54.15", "12.4"), "b": ("535.104.05", "12.2")})
    assert (split.node, split.subject, split.status) == ("fleet", "driver", Status.WARN)
    assert "driver 535.104.05 (CUDA 12.2) on b" in split.message and "driver 550.54.15 (CUDA 12.4) on a" in split.message
    out = judge_driver_consistency({"a": ("1", "x"), "b": ("1", "x"), "c": ("2", "y"), "d": ("3", "z")})
    assert {f.node: f.status for f in out} == {"a": Status.OK, "b": Status.OK, "c": Status.WARN, "d": Status.WARN}
    # and through judge_fleet, a mixed-VBIOS node is left out of the fleet comparison
    fleet = rules.judge_fleet([("a", _node(H100)), ("b", _node(FAULTS))])
    assert {(f.check, f.node) for f in fleet} == {("gpu.driver_consistency", "a"), ("gpu.driver_consistency", "b")}


def test_pcie_replay_rate_between_audits() -> None:
    gpu = H100.gpus[0]  # a real capture: replay_counter 150, Gen5 x16 (DCGM: 31/min)
    assert gpu.pcie_replays == 150 and expected_rate(5, 16) == 31 and expected_rate(3, 8) == 4
    node = _node(H100)
    first = judge_pcie_replay("n1", gpu, node, None)
    assert first is not None and first.status is Status.OK and "needs an earlier audit" in first.message
    assert first.details["memory"] == {"replays": 150, "at": BOOT + 3600, "boot_time": BOOT}
    ten_min_ago = {"replays": 0, "at": BOOT + 3000, "boot_time": BOOT}
    ok = judge_pcie_replay("n1", gpu, node, ten_min_ago)
    assert ok is not None and ok.status is Status.OK and ok.details["per_min"] == 15.0
    one_min_ago = {"replays": 0, "at": BOOT + 3540, "boot_time": BOOT}
    bad = judge_pcie_replay("n1", gpu, node, one_min_ago)
    assert bad is not None and bad.status is Status.WARN and "above 31/min for Gen5 x16" in bad.message
    rebooted = judge_pcie_replay("n1", gpu, node, {**one_min_ago, "boot_time": BOOT - 86400})
    assert rebooted is not None and "needs an earlier audit" in rebooted.message
    # judge_node reads the audit memory per GPU
    findings = rules.judge_node("n1", node, P, 8, {"gpu.pcie_replay": {"GPU0": one_min_ago}})
    assert _of(findings, "gpu.pcie_replay")["GPU0"].status is Status.WARN
    assert _of(findings, "gpu.pcie_replay")["GPU1"].status is Status.OK


def test_judge_vbios_reads_each_model_apart() -> None:
    gpus = (H100.gpus[0], A100.gpus[0].with_(index=1))
    out = judge_vbios("n1", NodeGpuFacts(source="nvml", gpus=gpus))
    assert [f.status for f in out] == [Status.OK, Status.OK]
