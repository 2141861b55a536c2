"""The node-side gatherer (infer_ctl/facts/nvml_node_script.py), run for real in a subprocess exactly as
the node runs it (`python3 -` with the script on stdin), against a FAKE `pynvml` (tests/gpu/fake_nvml):
only the NVML library boundary is faked. Stand-in `journalctl`/`nvidia-smi` executables on PATH play the
node's tools. The JSON it prints is then parsed by the controller-side parser."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infer_ctl.core.findings import Status
from infer_ctl.core.gpu.rules import judge_gather_error, judge_xids
from infer_ctl.facts.nvml_gatherer import (
    GathererOutputError,
    gather_command,
    gatherer_script,
    parse_gatherer_output,
)
from infer_ctl.profile.gpu import GpuPolicy

FAKE_NVML = Path(__file__).parent / "fake_nvml"
FIXTURES = Path(__file__).parents[1] / "fixtures"


def _standin(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_gatherer(tmp_path: Path, scenario: dict | None, *, klog: str = "", source: str = "auto",
                 fake_nvml: bool = True, smi_xml: Path | None = None) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "klog.txt").write_text(klog)
    _standin(bin_dir, "journalctl", f"cat {tmp_path / 'klog.txt'}")
    if smi_xml is not None:
        _standin(bin_dir, "nvidia-smi", f'[ "$1" = "-q" ] && cat {smi_xml} && exit 0\nexit 0')
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_NVML_SCENARIO": json.dumps(scenario or {}),
        "PYTHONPATH": str(FAKE_NVML) if fake_nvml else "",
    }
    if not fake_nvml:
        # a directory whose `pynvml` import fails: "bindings absent" on the node
        (tmp_path / "nobind").mkdir(exist_ok=True)
        (tmp_path / "nobind" / "pynvml.py").write_text("raise ImportError('no nvidia-ml-py here')\n")
        env["PYTHONPATH"] = str(tmp_path / "nobind")
    argv = list(gather_command(sys.executable, source=source, window_h=1).argv)
    proc = subprocess.run(argv, input=gatherer_script(), capture_output=True, env=env, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def _gpus(n: int, **per_index: dict) -> list[dict]:
    return [per_index.get(f"gpu{i}", {}) for i in range(n)]


def test_healthy_node_via_nvml(tmp_path: Path) -> None:
    facts = parse_gatherer_output(run_gatherer(tmp_path, {"devices": _gpus(2)}))
    assert facts.source == "nvml" and facts.error is None
    assert (facts.driver_version, facts.cuda_version, facts.gpu_count) == ("550.54.15", "12.4", 2)
    g0 = facts.gpus[0]
    assert g0.persistence_mode is True and g0.ecc_current is True
    assert (g0.remap_pending, g0.remap_failure, g0.recovery_action) == (False, False, "none")
    assert g0.clock_reasons == frozenset({"gpu_idle"})
    assert (g0.pcie_width_current, g0.pcie_width_max, g0.slowdown_temp_c, g0.temp_c) == (16, 16, 89, 35)
    assert g0.nvlinks is not None and len(g0.nvlinks) == 18 and all(link.active for link in g0.nvlinks)
    assert g0.pci_bus_id == "00000000:18:00.0"
    assert facts.xids == () and facts.xid_source == "journalctl"


def test_deprecated_calls_fall_back_to_the_older_ones(tmp_path: Path) -> None:
    # an old driver lacks nvmlDeviceGetCurrentClocksEventReasons / TemperatureV (FUNCTION_NOT_FOUND):
    # the gatherer must use ...ThrottleReasons / GetTemperature instead of reporting nothing
    dev = {
        "errors": {"nvmlDeviceGetCurrentClocksEventReasons": 13, "nvmlDeviceGetTemperatureV": 13},
        "values": {"nvmlDeviceGetCurrentClocksThrottleReasons": 0x40, "nvmlDeviceGetTemperature": 77},
    }
    g = parse_gatherer_output(run_gatherer(tmp_path, {"devices": [dev]})).gpus[0]
    assert g.clock_reasons == frozenset({"hw_thermal_slowdown"})
    assert g.temp_c == 77
    assert g.errors == ()


def test_gpu_lost_and_reset_required_become_per_gpu_errors(tmp_path: Path) -> None:
    devs = _gpus(
        3,
        gpu1={"errors": {"nvmlDeviceGetHandleByIndex": 15}},
        gpu2={"errors": {"nvmlDeviceGetTemperatureV": 16, "nvmlDeviceGetTemperature": 16}},
    )
    facts = parse_gatherer_output(run_gatherer(tmp_path, {"devices": devs}))
    assert [g.errors for g in facts.gpus] == [(), ("GPU is lost",), ("GPU requires reset",)]
    assert facts.gpus[1].persistence_mode is None  # nothing else is invented for a lost GPU


def test_row_remap_pending_ecc_and_nvlink_down(tmp_path: Path) -> None:
    dev = {
        "values": {
            "nvmlDeviceGetRemappedRows": [0, 2, 1, 0],
            "ecc": {"uncorrected_volatile": 3},
            "inactive_links": [4, 5],
            "nvlink_errors": {"0:0": 7},
            "recovery_action": 1,
        }
    }
    g = parse_gatherer_output(run_gatherer(tmp_path, {"devices": [dev]})).gpus[0]
    assert (g.remap_uncorrectable, g.remap_pending, g.remap_failure) == (2, True, False)
    assert g.ecc_volatile_uncorrected == 3
    assert [link.link for link in g.nvlinks or () if not link.active] == [4, 5]
    assert g.nvlinks is not None and g.nvlinks[0].replay_errors == 7
    assert g.recovery_action == "gpu_reset"


def test_pre_ampere_gpu_reports_retired_pages_instead_of_row_remap(tmp_path: Path) -> None:
    dev = {"errors": {"nvmlDeviceGetRemappedRows": 3}, "values": {"retired_pages": {"0": 2, "1": 1}, "retired_pending": 1}}
    g = parse_gatherer_output(run_gatherer(tmp_path, {"devices": [dev]})).gpus[0]
    assert (g.remap_pending, g.retired_sbe, g.retired_dbe, g.retired_pending) == (None, 2, 1, True)


def test_stray_processes_are_named_from_proc(tmp_path: Path) -> None:
    pid = os.getpid()  # a real process, so /proc/<pid>/comm is real
    dev = {"values": {"memory_used_mib": 5000, "processes": [{"pid": pid, "used_mib": 4900}]}}
    g = parse_gatherer_output(run_gatherer(tmp_path, {"devices": [dev]})).gpus[0]
    assert g.memory_used_mib == 5000
    assert g.processes is not None and g.processes[0].pid == pid and g.processes[0].used_mib == 4900
    assert g.processes[0].name == Path(f"/proc/{pid}/comm").read_text().strip()


def test_kernel_log_xids_travel_with_the_facts(tmp_path: Path) -> None:
    klog = (FIXTURES / "kernel-xid" / "gpud-xid48-63-94-dbe-rowremap-contained.txt").read_text()
    facts = parse_gatherer_output(run_gatherer(tmp_path, {"devices": _gpus(1)}, klog=klog))
    assert facts.xids is not None
    assert [e.xid for e in facts.xids][:3] == [48, 63, 94]


def test_driver_library_mismatch_is_a_node_error(tmp_path: Path) -> None:
    facts = parse_gatherer_output(run_gatherer(tmp_path, {"init_error": 18}))
    assert facts.error_kind == "driver_mismatch" and "mismatch" in (facts.error or "")


def test_no_library_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    xml = FIXTURES / "nvidia-smi-qx" / "k8stestinfra-a100-sxm4-40gb-lambda-570.148.08.xml"
    facts = parse_gatherer_output(run_gatherer(tmp_path, {"init_error": 12}, smi_xml=xml))
    assert facts.source == "nvidia-smi" and facts.driver_version == "570.148.08"
    assert facts.notes and "NVML unavailable" in facts.notes[0]


def test_no_bindings_and_no_nvidia_smi_means_no_driver(tmp_path: Path) -> None:
    facts = parse_gatherer_output(run_gatherer(tmp_path, None, fake_nvml=False))
    assert facts.source == "none" and facts.error_kind == "no_driver"
    assert "nvidia-smi is not installed" in (facts.error or "")


@pytest.mark.parametrize("text", ["", "python3: command not found\n", '{"version": 99}\n'])
def test_garbage_from_the_node_is_a_clear_error(text: str) -> None:
    with pytest.raises(GathererOutputError):
        parse_gatherer_output(text)


def _run_script(tmp_path: Path, bin_dir: Path, *extra: str, timeout: float = 30) -> tuple[str, float]:
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "nobind")}
    (tmp_path / "nobind").mkdir(exist_ok=True)
    (tmp_path / "nobind" / "pynvml.py").write_text("raise ImportError('no nvidia-ml-py here')\n")
    argv = [sys.executable, "-", "--source", "nvidia-smi", "--window-min", "60", *extra]
    started = time.monotonic()
    proc = subprocess.run(argv, input=gatherer_script(), capture_output=True, env=env, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode(), time.monotonic() - started


def test_a_hung_nvidia_smi_is_stopped_within_the_budget_and_the_kernel_log_still_read(tmp_path: Path) -> None:
    """The stand-in nvidia-smi hangs in a child process (like a tool stuck in the driver keeps its
    pipes open); the gatherer must give up on it, kill its group, and still read the XIDs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _standin(bin_dir, "nvidia-smi", "sleep 300")
    xid = "[ 3606.8] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, GPU has fallen off the bus.\n"
    (tmp_path / "klog.txt").write_text(xid)
    _standin(bin_dir, "journalctl", f"cat {tmp_path / 'klog.txt'}")
    out, took = _run_script(tmp_path, bin_dir, "--budget", "10")
    facts = parse_gatherer_output(out)
    assert took < 9, f"the gatherer took {took:.1f}s with a 10s budget"
    assert facts.error_kind == "hung" and "did not answer" in (facts.error or "")
    assert facts.xids is not None and [x.xid for x in facts.xids] == [79]
    finding = judge_gather_error("n1", facts, 8)[0]
    assert finding.status == Status.UNKNOWN and "gpu.xid" in (finding.remedy or "")


def test_journalctl_without_journal_access_is_not_read_as_no_xids(tmp_path: Path) -> None:
    """journalctl exits 0 for a user outside adm/systemd-journal but shows no kernel lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _standin(bin_dir, "nvidia-smi", "exit 9")
    _standin(
        bin_dir, "journalctl",
        'echo "Hint: You are currently not seeing messages from other users and the system." >&2; exit 0',
    )
    _standin(bin_dir, "dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2; exit 1')
    facts = parse_gatherer_output(_run_script(tmp_path, bin_dir)[0])
    assert facts.xids is None and "may not read the system journal" in (facts.xid_error or "")
    finding = judge_xids("n1", facts, GpuPolicy())[0]
    assert finding.status == Status.UNKNOWN and "systemd-journal" in (finding.remedy or "")


def _btime() -> int:
    return next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))


def test_the_gatherer_reports_the_boot_time_and_its_clock(tmp_path: Path) -> None:
    before = time.time()
    facts = parse_gatherer_output(run_gatherer(tmp_path, {"devices": _gpus(1)}))
    assert facts.boot_time == _btime() and facts.gathered_at is not None
    assert before - 1 <= facts.gathered_at <= time.time() + 1


def test_dmesg_seconds_since_boot_become_unix_time_and_sxid_lines_are_kept(tmp_path: Path) -> None:
    """journalctl refused: the dmesg fallback (real fixture, `[ 1843.308145]` stamps) plus SXid lines."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _standin(bin_dir, "nvidia-smi", "exit 9")
    _standin(bin_dir, "journalctl", 'echo "No journal files were found." >&2; exit 1')
    dmesg = (FIXTURES / "kernel-xid" / "nvsentinel-issue155-fallen-off-bus-no-xid-570.txt").read_text()
    dmesg += "[ 1900.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up\n"
    (tmp_path / "dmesg.txt").write_text(dmesg)
    _standin(bin_dir, "dmesg", f"cat {tmp_path / 'dmesg.txt'}")
    facts = parse_gatherer_output(_run_script(tmp_path, bin_dir)[0])
    assert facts.xid_source == "dmesg" and facts.xids is not None and facts.sxids is not None
    (fallen,) = facts.xids
    assert fallen.xid == 79 and fallen.epoch == pytest.approx(_btime() + 1843.308145)
    (sxid,) = facts.sxids
    assert (sxid.sxid, sxid.severity, sxid.pci) == (20034, "fatal", "0000:06:00.0")


def test_nvml_board_facts_fabric_power_hbm_vbios_inforom(tmp_path: Path) -> None:
    """The board facts read through NVML (fake library boundary): fabric registration in progress
    (NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2), a lowered enforced limit (mW), HBM temperature (field 82) and
    its limit (threshold 2), VBIOS, a corrupted InfoROM (NVML_ERROR_CORRUPTED_INFOROM = 14)."""
    scenario = {"devices": _gpus(
        2,
        gpu0={"values": {"fabric": {"state": 2, "status": 0}, "nvmlDeviceGetEnforcedPowerLimit": 500000,
                         "memory_temp": 93}},
        gpu1={"values": {"inforom_error": 14, "nvmlDeviceGetVbiosVersion": "96.00.74.00.01"}},
    )}
    facts = parse_gatherer_output(run_gatherer(tmp_path, scenario))
    g0, g1 = facts.gpus
    assert (g0.fabric_state, g0.fabric_status, g1.fabric_state) == ("in_progress", "success", "completed")
    assert (g0.power_limit_w, g0.default_power_limit_w) == (500.0, 700.0)
    assert (g0.mem_temp_c, g0.mem_max_temp_c) == (93, 95)
    assert (g0.vbios_version, g1.vbios_version) == ("96.00.99.00.01", "96.00.74.00.01")
    assert (g0.inforom_valid, g1.inforom_valid) == (True, False) and not g1.errors  # not a GPU read error


def test_nvidia_smi_exit_14_is_a_corrupted_inforom_not_a_dead_node(tmp_path: Path) -> None:
    """nvidia-smi prints its document, then `WARNING: infoROM is corrupted at gpu ...`, and exits 14."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    xml = FIXTURES / "nvidia-smi-qx" / "k8stestinfra-h100x8-580.105.08.xml"
    _standin(bin_dir, "nvidia-smi", f'[ "$1" = "-q" ] || exit 0\ncat {xml}\n'
             'echo "WARNING: infoROM is corrupted at gpu 0000:75:00.0"\nexit 14')
    _standin(bin_dir, "journalctl", ":")
    facts = parse_gatherer_output(_run_script(tmp_path, bin_dir)[0])
    assert facts.error is None and facts.source == "nvidia-smi" and len(facts.gpus) == 8
    assert [g.index for g in facts.gpus if g.inforom_valid is False] == [2]
    # exit 14 without a document stays a node-level hardware error
    _standin(bin_dir, "nvidia-smi", 'echo "WARNING: infoROM is corrupted at gpu 0000:75:00.0"; exit 14')
    facts = parse_gatherer_output(_run_script(tmp_path, bin_dir)[0])
    assert facts.error_kind == "hardware" and "infoROM" in (facts.error or "")


def test_the_document_travels_compressed_and_without_the_unread_clock_tables(tmp_path: Path) -> None:
    """--compress (what the check sends): one `Z1 <base64 zlib>` line; nvidia-smi's <supported_clocks>
    (over half an H100 document, read by no rule) is dropped on the node."""
    import base64
    import zlib

    xml = FIXTURES / "nvidia-smi-qx" / "k8stestinfra-h100x8-580.105.08.xml"
    assert "<supported_clocks>" in xml.read_text()
    out = run_gatherer(tmp_path, {"init_error": 12}, smi_xml=xml)
    assert out.startswith("Z1 ") and len(out) < len(xml.read_text()) / 10
    doc = json.loads(zlib.decompress(base64.b64decode(out[3:])))
    assert "<supported_clocks>" not in doc["smi"]["qx"]["out"] and "<fabric>" in doc["smi"]["qx"]["out"]
    facts = parse_gatherer_output(out)
    assert facts.source == "nvidia-smi" and len(facts.gpus) == 8 and facts.gpus[0].pcie_replays == 150
    with pytest.raises(GathererOutputError, match="damaged"):
        parse_gatherer_output("Z1 bm90IHpsaWI=\n")


def test_the_subprocess_fallback_of_pythons_before_3_8_reads_and_kills_alike(tmp_path: Path) -> None:
    """Nodes with Python 3.6/3.7 have no os.posix_spawnp: the gatherer falls back to subprocess. Same
    document from the same tools, and a hung nvidia-smi is still stopped within the budget."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    xml = FIXTURES / "nvidia-smi-qx" / "k8stestinfra-h100x8-580.105.08.xml"
    _standin(bin_dir, "nvidia-smi", f'[ "$1" = "-q" ] && cat {xml}\nexit 0')
    (tmp_path / "klog.txt").write_text("[ 3606.8] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, GPU has fallen off the bus.\n")
    _standin(bin_dir, "journalctl", f"cat {tmp_path / 'klog.txt'}")
    script = tmp_path / "gatherer.py"
    script.write_bytes(gatherer_script())
    old_python = tmp_path / "py36.py"  # runs the gatherer as if os had no posix_spawnp
    old_python.write_text(f"import os, sys\ndel os.posix_spawnp\nsys.argv = ['-'] + sys.argv[1:]\n"
                          f"exec(compile(open({str(script)!r}).read(), '<stdin>', 'exec'), {{'__name__': '__main__'}})\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "nobind")}
    (tmp_path / "nobind").mkdir()
    (tmp_path / "nobind" / "pynvml.py").write_text("raise ImportError('no nvidia-ml-py here')\n")

    def gather(*argv: str) -> tuple[str, float]:
        started = time.monotonic()
        proc = subprocess.run(list(argv), capture_output=True, env=env, timeout=30, check=False,
                              input=gatherer_script() if argv[1] == "-" else None)
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout.decode(), time.monotonic() - started

    new = parse_gatherer_output(gather(sys.executable, "-", "--source", "nvidia-smi")[0])
    old = parse_gatherer_output(gather(sys.executable, str(old_python), "--source", "nvidia-smi")[0])
    assert dataclasses.replace(old, gathered_at=None) == dataclasses.replace(new, gathered_at=None)
    assert len(old.gpus) == 8 and [x.xid for x in old.xids or ()] == [79]
    _standin(bin_dir, "nvidia-smi", "sleep 300")
    out, took = gather(sys.executable, str(old_python), "--source", "nvidia-smi", "--budget", "10")
    assert took < 9 and parse_gatherer_output(out).error_kind == "hung"
