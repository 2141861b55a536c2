"""nvidia-smi parsers on real outputs (tests/fixtures/nvidia-smi-qx, -nvlink; provenance in README.md there):
several driver generations (470 .. 595, DTD v11 .. v13), N/A handling and element-name drift."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from infer_ctl.facts.nvidia_smi import (
    NvidiaSmiParseError,
    merge_nvlink,
    parse_nvidia_smi_xml,
    parse_nvlink_errors,
    parse_nvlink_status,
)

QX = Path(__file__).parents[1] / "fixtures" / "nvidia-smi-qx"
NVLINK = Path(__file__).parents[1] / "fixtures" / "nvidia-smi-nvlink"
XML_FILES = sorted(QX.glob("*.xml"))


def _as_plain(value: object) -> object:
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, tuple):
        return [_as_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.stem)
def test_xml_matches_expected(path: Path) -> None:
    expected = json.loads(path.with_suffix(".expected.json").read_text())
    doc = parse_nvidia_smi_xml(path.read_text())
    assert (doc.driver_version, doc.cuda_version, doc.attached_gpus) == (
        expected["driver_version"], expected["cuda_version"], expected["attached_gpus"]
    )
    assert len(doc.gpus) == len(expected["gpus"])
    for gpu, want in zip(doc.gpus, expected["gpus"], strict=True):
        got = {key: _as_plain(getattr(gpu, key)) for key in want}
        assert got == want, f"GPU{gpu.index}"


def test_every_fixture_has_an_expected_file() -> None:
    assert XML_FILES and all(p.with_suffix(".expected.json").exists() for p in XML_FILES)


def test_v13_reports_temperature_as_tlimit_margin_not_absolute_thresholds() -> None:
    gpu = parse_nvidia_smi_xml((QX / "k8stestinfra-h100x8-580.105.08.xml").read_text()).gpus[0]
    assert (gpu.temp_c, gpu.tlimit_margin_c, gpu.tlimit_slowdown_c, gpu.slowdown_temp_c) == (29, 58, -2, None)


def test_old_drivers_use_throttle_names_and_absolute_thresholds() -> None:
    gpu = parse_nvidia_smi_xml((QX / "telegraf-tesla-t4-515.105.01.xml").read_text()).gpus[0]
    assert gpu.clock_reasons == frozenset()  # <clocks_throttle_reasons>, all "Not Active"
    assert (gpu.slowdown_temp_c, gpu.shutdown_temp_c) == (93, 96)
    assert gpu.remap_pending is None  # <remapped_rows>N/A</remapped_rows> on Turing


def test_pascal_ecc_counts_come_from_double_bit_totals() -> None:
    gpu = parse_nvidia_smi_xml((QX / "netdata-tesla-p100-pcie-510.47.03.xml").read_text()).gpus[0]
    assert (gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_corrected) == (0, 3)
    assert (gpu.retired_sbe, gpu.retired_dbe, gpu.retired_pending) == (0, 0, False)


def test_lost_gpu_reads_as_missing_values_plus_an_error() -> None:
    doc = parse_nvidia_smi_xml((QX / "k8stestinfra-MOCK-gb200-gpu1-lost.xml").read_text())
    healthy, lost = doc.gpus
    assert healthy.errors == () and lost.errors == ("GPU is lost",)
    assert lost.memory_used_mib is None and lost.remap_failure is None
    # the mock's healthy GPU0 carries a row-remap failure and DBEs: real flags, not errors
    assert healthy.remap_failure is True and healthy.ecc_volatile_uncorrected == 5


@pytest.mark.parametrize("text", ["", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                                  "<html></html>", "<nvidia_smi_log><gpu>"])
def test_non_xml_is_rejected_clearly(text: str) -> None:
    with pytest.raises(NvidiaSmiParseError):
        parse_nvidia_smi_xml(text)


# ---- nvlink -s / -e ----------------------------------------------------------------------------------
NVLINK_STATUS_CASES = [
    # file, {gpu: (active, inactive, note)}
    ("s-gpud-a100-sxm4-80gb-x8.txt", {i: (12, 0, None) for i in range(8)}),
    ("s-azurehpc-a100-sxm4-80gb-single-gpu-good.txt", {7: (12, 0, None)}),
    ("s-azurehpc-a100-sxm4-80gb-all-links-inactive.txt", {6: (0, 0, "all links inactive")}),
    ("s-hpe-a100-pcie-40gb-x2-no-nvlink-555.42.02.txt", {0: (0, 0, "all links inactive"), 1: (0, 0, "all links inactive")}),
    ("s-hpe-h100-pcie-x2-nvlink-bridge-inactive-links.txt", {0: (12, 6, None), 1: (12, 6, None)}),
    ("s-nvgpuexp-h100-80gb-hbm3-590.48.01-18links.txt", {0: (18, 0, None)}),
    ("s-nvgpuexp-h200-590.48.01.txt", {0: (18, 0, None)}),
    ("s-nvgpuexp-h100-mig-590.48.01.txt", {0: (0, 0, "not supported in MIG mode")}),
    ("s-nvgpuexp-l40s-595.80-no-nvlink.txt", {0: (0, 0, "no NVLink")}),
    ("s-gpud-a10-empty.txt", {}),
    ("s-hpe-h100-pcie-x2-nvlink-R-remote.txt", {0: (0, 0, None), 1: (0, 0, None)}),
]


@pytest.mark.parametrize(("name", "expected"), NVLINK_STATUS_CASES, ids=[c[0] for c in NVLINK_STATUS_CASES])
def test_nvlink_status(name: str, expected: dict) -> None:
    parsed = parse_nvlink_status((NVLINK / name).read_text())
    got = {
        gpu: (sum(link.active for link in st.links), sum(not link.active for link in st.links), st.note)
        for gpu, st in parsed.items()
    }
    assert got == expected


def test_nvlink_status_elided_paste_keeps_what_is_there() -> None:
    parsed = parse_nvlink_status((NVLINK / "s-k8stestinfra-issue371-gb200-nvlink5-ELIDED.txt").read_text())
    assert len(parsed[0].links) == 18 and parsed[0].links[0].speed_gbps == 53.125
    assert len(parsed[1].links) == 2  # the poster elided the rest


def test_nvlink_errors() -> None:
    h100 = parse_nvlink_errors((NVLINK / "e-stas00-h100-80gb-hbm3-nvlink-e-ELIDED.txt").read_text())
    assert sorted(h100[0]) == [0, 1, 17]
    assert h100[0][17] == {"replay": 0, "recovery": 0, "crc": 0}
    gb300 = parse_nvlink_errors((NVLINK / "e-srtslurm-pr307-gb300-ABBREVIATED.txt").read_text())
    assert gb300 == {0: {0: {"replay": 0, "recovery": 0, "crc": 0}}}


def test_merge_nvlink_marks_gpus_absent_from_the_output_as_without_nvlink() -> None:
    doc = parse_nvidia_smi_xml((QX / "k8stestinfra-l40s-aws-g6e-595.91.07.xml").read_text())
    merged = merge_nvlink(doc.gpus, parse_nvlink_status(""), None)
    assert merged[0].nvlinks == () and merged[0].nvlink_note == "no NVLink"
    assert merge_nvlink(doc.gpus, None, None)[0].nvlinks is None  # not gathered
    errors = {0: {3: {"replay": 2, "recovery": 0, "crc": 1}}}
    status = parse_nvlink_status("GPU 0: X (UUID: GPU-1)\n\t Link 3: 25 GB/s\n")
    link = merge_nvlink(doc.gpus, status, errors)[0].nvlinks[0]  # type: ignore[index]
    assert (link.link, link.active, link.replay_errors, link.crc_errors) == (3, True, 2, 1)
