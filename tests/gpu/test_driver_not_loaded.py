"""A GPU node whose NVIDIA kernel module is not loaded: nvidia-smi prints "couldn't
communicate with the NVIDIA driver" and exits 9, NVML raises NVMLError_DriverNotLoaded. Where the profile
says the node has GPUs that is a FAIL (exit 2) with the DKMS/reboot remedy, as gpud and DCGM judge it,
not an UNKNOWN telling the user to install a driver that is installed.

What is real: the gatherer script run by a real interpreter through the local connector, `check gpu`'s
CLI. Stand-ins: `nvidia-smi` (a shell script printing the driver's own words) and the fake pynvml
(tests/gpu/fake_nvml) raising NVML's error code 9.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.core.findings import Status
from infer_ctl.core.gpu import rules
from infer_ctl.core.gpu.facts import NodeGpuFacts
from infer_ctl.facts.nvml_gatherer import parse_gatherer_output
from infer_ctl.profile.gpu import GpuPolicy

FAKE_NVML = Path(__file__).parent / "fake_nvml"
#: nvidia-smi's message when the module is not loaded (driver 5xx, the same since 3xx)
SMI_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
    "latest NVIDIA driver is installed and running."
)


def _standin_smi(bin_dir: Path) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "nvidia-smi"
    path.write_text(f"#!/bin/sh\necho '{SMI_NOT_LOADED}'\nexit 9\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (bin_dir / "journalctl").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "journalctl").chmod(0o755)


@pytest.fixture
def unloaded_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine as a node whose driver is not loaded, seen by NVML and nvidia-smi alike."""
    _standin_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(FAKE_NVML))
    monkeypatch.setenv("FAKE_NVML_SCENARIO", json.dumps({"init_error": 9}))
    return tmp_path


def _profile(tmp_path: Path, gpus: int) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "collocated": True,
        "nodes": [{"name": "gpu-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"], "gpus": gpus}],
        "gpu": {"python": sys.executable, "timeout_s": 30},
    }))  # fmt: skip
    return path


def test_check_gpu_fails_with_the_dkms_remedy(unloaded_node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["check", "gpu", "-p", str(_profile(unloaded_node, 8)), "--json"])
    doc = json.loads(capsys.readouterr().out)
    (driver,) = [f for f in doc["findings"] if f["check"] == "gpu.driver"]
    assert rc == 2 and doc["status"] == "fail", doc
    assert driver["status"] == "fail"
    assert "not loaded" in driver["message"] and "8 GPUs" in driver["message"]
    for hint in ("dkms autoinstall", "lsmod | grep nvidia", "dmesg", "reboot into the kernel"):
        assert hint in driver["remedy"]


def test_a_node_without_gpus_in_the_profile_stays_unknown(
    unloaded_node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["check", "gpu", "-p", str(_profile(unloaded_node, 0)), "--json"])
    doc = json.loads(capsys.readouterr().out)
    (driver,) = [f for f in doc["findings"] if f["check"] == "gpu.driver"]
    assert rc == 3 and driver["status"] == "unknown", doc


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        # NVML says DriverNotLoaded and nvidia-smi is absent
        ({"nvml_error": {"code": 9, "message": "Driver Not Loaded"}}, "NVMLError_DriverNotLoaded"),
        # NVML's library is missing (no bindings), nvidia-smi says it
        ({"nvml_error": {"code": 12, "message": "NVML Shared Library Not Found"},
          "smi": {"qx": {"rc": 9, "out": SMI_NOT_LOADED, "err": ""}}}, "couldn't communicate"),
    ],
)  # fmt: skip
def test_both_sources_read_as_driver_not_loaded(doc: dict, message: str) -> None:
    base = {"version": 1, "klog": {}}
    facts = parse_gatherer_output(json.dumps({**base, **doc}))
    assert facts.error_kind == "driver_not_loaded" and message in (facts.error or "")


def test_the_rule() -> None:
    facts = NodeGpuFacts(source="none", error="nvidia-smi exit 9: not loaded", error_kind="driver_not_loaded", xids=())
    (fail, *_) = rules.judge_node("n1", facts, GpuPolicy(), 8)
    assert (fail.check, fail.status) == ("gpu.driver", Status.FAIL) and "dkms" in (fail.remedy or "")
    (unknown, *_) = rules.judge_node("n1", facts, GpuPolicy(), 0)
    assert unknown.status is Status.UNKNOWN
