"""`inferctl audit` and `inferctl check gpu` end to end over REAL sshd nodes (tests/sshd_harness.py).

What is real: OpenSSH servers on loopback, inferctl's SSH connector and fleet, the node-side gatherer
running under the node's python3 (its NVML init really fails: no GPU driver here), the CLI, the
textfile and history files. What is a stand-in: `nvidia-smi` and `journalctl` on each node's PATH
(GPUs do not exist here); they print real captures from tests/fixtures/ (one hand-edited, named so).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infer_ctl.cli.main import main

pytestmark = pytest.mark.ssh

FIX = Path(__file__).parents[1] / "fixtures"
H100 = FIX / "nvidia-smi-qx" / "k8stestinfra-h100x8-580.105.08.xml"
H100_REMAP = FIX / "nvidia-smi-qx" / "HAND-EDITED-h100x8-580.105.08-gpu3-remap-pending.xml"
# the real H100 capture's per-GPU format (`nvidia-smi nvlink -s`, 18 links), repeated for 8 GPUs
NVLINK_ONE = (FIX / "nvidia-smi-nvlink" / "s-nvgpuexp-h100-80gb-hbm3-590.48.01-18links.txt").read_text()
NVLINK_8 = "".join(NVLINK_ONE.replace("GPU 0:", f"GPU {i}:") for i in range(8))
# a real XID 79 line format (gpud regex; docs/reference/gpu-thresholds.md) for GPU2 of the H100 capture (PCI 75:00),
# stamped like `journalctl -o short-iso` a minute ago: since this machine's (the node's) last boot
XID79 = (
    datetime.fromtimestamp(time.time() - 60, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000")
    + " node kernel: NVRM: Xid (PCI:0000:75:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
)
NAMES = ["pf-01", "pf-02", "dc-01", "dc-02", "dc-03"]


def standin_gpu_node(cluster, name: str, xml: Path | None, klog: str = "") -> None:  # type: ignore[no-untyped-def]
    """STAND-IN nvidia-smi (prints a real capture) and journalctl (prints `klog`) on the node's PATH."""
    bin_dir = cluster.bin_dir(name)
    (bin_dir / "klog.txt").write_text(klog)
    cluster.add_executable(name, "journalctl", f"cat {bin_dir / 'klog.txt'}\n")
    if xml is None:
        (bin_dir / "nvidia-smi").unlink(missing_ok=True)
        return
    (bin_dir / "nvlink-s.txt").write_text(NVLINK_8)
    cluster.add_executable(
        name,
        "nvidia-smi",
        f'case "$1 $2" in\n'
        f'  "-q -x") cat {xml} ;;\n'
        f'  "nvlink -s") cat {bin_dir / "nvlink-s.txt"} ;;\n'
        f'  "nvlink -e") : ;;\n'
        f'  *) echo "stand-in nvidia-smi: unsupported $*" >&2; exit 2 ;;\n'
        f"esac\n",
    )


@pytest.fixture
def fleet(ssh_cluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    cluster = ssh_cluster(5, names=NAMES, roles=[["prefill"], ["prefill"], ["decode"], ["decode"], ["decode"]])
    standin_gpu_node(cluster, "pf-01", H100)
    standin_gpu_node(cluster, "pf-02", H100_REMAP)
    standin_gpu_node(cluster, "dc-01", H100, klog=XID79)
    standin_gpu_node(cluster, "dc-02", None)  # no NVIDIA driver at all
    standin_gpu_node(cluster, "dc-03", H100)
    cluster.stop("dc-03")  # unreachable
    profile = cluster.write_profile(tmp_path / "profile.yaml", gpu={"expected_count": 8})
    return cluster, profile


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    rc = main(list(args))
    out = capsys.readouterr().out
    return rc, json.loads(out)


def by_key(doc: dict) -> dict[tuple[str, str, str], dict]:
    return {(f["check"], f["node"], f["subject"]): f for f in doc["findings"]}


def test_audit_mixed_fleet(fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cluster, profile = fleet
    prom, hist = tmp_path / "tf" / "inferctl.prom", tmp_path / "audit.jsonl"
    # --only gpu: other families (fabric, servers, ...) have their own end-to-end tests
    rc, doc = run_cli(capsys, "audit", "-p", str(profile), "--json", "--only", "gpu",
                      "--textfile", str(prom), "--history", str(hist))
    assert rc == 2 and doc["status"] == "fail" and doc["exit_code"] == 2
    f = by_key(doc)
    # healthy node: every GPU finding ok, NVLink read from the stand-in's real-format output
    pf01 = [x for x in doc["findings"] if x["node"] == "pf-01"]
    assert pf01 and all(x["status"] == "ok" for x in pf01), [x for x in pf01 if x["status"] != "ok"]
    assert f[("gpu.nvlink", "pf-01", "GPU0")]["message"] == "18 NVLink links active"
    assert f[("gpu.count", "pf-01", "node")]["details"] == {"found": 8, "expected": 8}
    # pending row remap: names the GPU, the fact and the remedy
    remap = f[("gpu.row_remap", "pf-02", "GPU3")]
    assert remap["status"] == "fail" and remap["message"] == "row remap pending"
    assert "nvidia-smi -r -i 3" in remap["remedy"]
    # XID 79 from the kernel log, mapped to the GPU by PCI address
    xid = f[("gpu.xid", "dc-01", "GPU2")]
    assert xid["status"] == "fail" and "XID 79" in xid["message"] and "fell off the bus" in xid["remedy"]
    # no driver: UNKNOWN with what to do
    nodrv = f[("gpu.driver", "dc-02", "node")]
    assert nodrv["status"] == "unknown" and "no NVIDIA driver" in nodrv["message"]
    assert "install the NVIDIA driver" in nodrv["remedy"]
    # unreachable: UNKNOWN, and the rest of the fleet was still checked
    gone = f[("gpu.facts", "dc-03", "node")]
    assert gone["status"] == "unknown" and "not gathered" in gone["message"]
    # textfile: atomic, node_exporter format
    text = prom.read_text()
    assert 'inferctl_check_status{check="gpu.row_remap",code="IC-GPU-009",node="pf-02",subject="GPU3"} 2' in text
    assert 'inferctl_check_status{check="gpu.facts",code="IC-GPU-001",node="dc-03",subject="node"} 3' in text
    assert "inferctl_audit_status 2" in text and "inferctl_last_run_timestamp_seconds " in text
    assert 'inferctl_node_status{node="pf-01"} 0' in text
    assert not [p for p in prom.parent.iterdir() if p.name.endswith(".tmp")]
    # history: one JSON line
    (line,) = hist.read_text().splitlines()
    record = json.loads(line)
    assert record["status"] == "fail" and ["gpu.row_remap", "pf-02", "GPU3", "fail", "row remap pending"] in record["findings"]
    # one SSH connection per reachable node for the whole run
    for name in ("pf-01", "pf-02", "dc-01", "dc-02"):
        assert cluster.sshd_log(name).read_text().count("Accepted publickey") == 1

    # the operator resets pf-02's GPU3: the next run reports only the change, exit code still whole-fleet
    standin_gpu_node(cluster, "pf-02", H100)
    rc2, doc2 = run_cli(capsys, "audit", "-p", str(profile), "--json", "--only", "gpu",
                        "--history", str(hist), "--since-last")
    assert rc2 == 2
    changes = {(c["check"], c["node"], c["subject"]): c for c in doc2["changes"]}
    assert changes == {("gpu.row_remap", "pf-02", "GPU3"): changes[("gpu.row_remap", "pf-02", "GPU3")]}
    assert changes[("gpu.row_remap", "pf-02", "GPU3")]["change"] == "recovered"
    assert [x["check"] for x in doc2["findings"]] == ["gpu.row_remap"]
    assert len(hist.read_text().splitlines()) == 2


def test_check_gpu_healthy_subset_and_only(fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    _cluster, profile = fleet
    rc, doc = run_cli(capsys, "check", "gpu", "-p", str(profile), "--json", "--nodes", "pf-01")
    assert rc == 0 and doc["command"] == "check gpu" and {x["node"] for x in doc["findings"]} == {"pf-01"}
    rc, doc = run_cli(capsys, "audit", "-p", str(profile), "--json", "--only", "gpu", "--nodes", "dc-02,dc-03")
    assert rc == 3 and doc["status"] == "unknown"


def test_audit_usage_errors(fleet, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    _cluster, profile = fleet
    assert main(["audit", "-p", str(profile), "--only", "gpu,nosuch"]) == 64
    assert "unknown check family nosuch" in capsys.readouterr().err
    assert main(["audit", "-p", str(profile), "--since-last"]) == 64
    assert "--since-last needs --history" in capsys.readouterr().err
    assert main(["audit", "-p", str(profile), "--only", ","]) == 64
    assert "names no check family" in capsys.readouterr().err


def test_check_gpu_table_lists_problems_only_unless_all(fleet, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    # one healthy 8-GPU node yields ~120 OK findings: the table must not print them by default
    _cluster, profile = fleet
    assert main(["check", "gpu", "-p", str(profile), "--nodes", "pf-01"]) == 0
    out = capsys.readouterr().out
    assert "gpu.nvlink" not in out and "overall: OK" in out and "--all lists them" in out
    assert len(out.splitlines()) <= 3, out
    assert main(["check", "gpu", "-p", str(profile), "--nodes", "pf-01", "--all"]) == 0
    out = capsys.readouterr().out
    assert out.count("gpu.nvlink") == 8 and "--all lists them" not in out
    # a node with a problem: only the problem row, then the summary with the counts
    assert main(["check", "gpu", "-p", str(profile), "--nodes", "pf-01,pf-02"]) == 2
    out = capsys.readouterr().out
    assert "gpu.row_remap" in out and "pf-02" in out and "GPU3" in out and "nvidia-smi -r -i 3" in out
    assert "gpu.nvlink" not in out and "overall: FAIL" in out and " ok" in out.splitlines()[-2]
    # JSON is unchanged: every finding
    rc, doc = run_cli(capsys, "check", "gpu", "-p", str(profile), "--json", "--nodes", "pf-01")
    assert rc == 0 and sum(f["check"] == "gpu.nvlink" for f in doc["findings"]) == 8


def test_since_last_never_reports_an_unreachable_nodes_problems_as_recovered(  # type: ignore[no-untyped-def]
    fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pf-02 fails (row remap pending), then its sshd dies: the RMA alert must not resolve."""
    cluster, profile = fleet
    hist, prom = tmp_path / "audit.jsonl", tmp_path / "inferctl.prom"
    args = ("audit", "-p", str(profile), "--json", "--only", "gpu", "--history", str(hist), "--since-last",
            "--nodes", "pf-01,pf-02")
    rc, _ = run_cli(capsys, *args)
    assert rc == 2
    cluster.stop("pf-02")
    rc, doc = run_cli(capsys, *args, "--textfile", str(prom))
    assert rc == 3  # nothing checked failed; pf-02 could not be checked
    changes = {(c["check"], c["node"], c["subject"]): c["change"] for c in doc["changes"]}
    assert changes[("gpu.row_remap", "pf-02", "GPU3")] == "not_checked"
    assert changes[("gpu.facts", "pf-02", "node")] == "new"
    assert "recovered" not in changes.values(), changes
    (row,) = [f for f in doc["findings"] if f["check"] == "gpu.row_remap"]
    assert row["status"] == "unknown" and "last known fail: row remap pending" in row["message"]
    assert json.loads(hist.read_text().splitlines()[-1])["not_checked"] == [
        ["gpu.row_remap", "pf-02", "GPU3", "fail", "row remap pending"]]
    # still away: nothing new to say
    rc, doc = run_cli(capsys, *args)
    assert rc == 3 and doc["changes"] == []
    # back, and its GPU was reset meanwhile: now it recovers
    standin_gpu_node(cluster, "pf-02", H100)
    cluster.start("pf-02")
    rc, doc = run_cli(capsys, *args)
    changes = {(c["check"], c["node"], c["subject"]): c["change"] for c in doc["changes"]}
    assert rc == 0 and changes[("gpu.row_remap", "pf-02", "GPU3")] == "recovered"


def _btime() -> int:
    """The boot time of this machine, which the node-side gatherer reads from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise AssertionError("no btime in /proc/stat")


def _xid79_at(epoch: float) -> str:
    """XID79 with another journal stamp."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S+0000") + " " + XID79.split(" ", 1)[1]


def test_xid_before_the_last_boot_is_ok_and_one_that_recurs_after_a_reboot_is_escalated(  # type: ignore[no-untyped-def]
    fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node was rebooted as the XID 79 remedy says: its journal still shows the XID (persistent journal)
    but from the boot before, so it is not a failure now. When the XID comes back after the reboot (here:
    the audit history remembers it from a run in an earlier boot), the remedy becomes hardware inspection."""
    cluster, profile = fleet
    boot = _btime()
    standin_gpu_node(cluster, "dc-01", H100, klog=_xid79_at(boot - 600))
    rc, doc = run_cli(capsys, "check", "gpu", "-p", str(profile), "--json", "--nodes", "dc-01")
    xid = by_key(doc)[("gpu.xid", "dc-01", "GPU2")]
    assert rc == 0 and xid["status"] == "ok" and "before the last boot" in xid["message"]
    assert xid["details"]["boot_time"] == boot

    # the XID is back in this boot; an earlier audit (in the boot before) saw it too
    standin_gpu_node(cluster, "dc-01", H100, klog=XID79)
    hist = tmp_path / "audit.jsonl"
    args = ("audit", "-p", str(profile), "--json", "--only", "gpu", "--nodes", "dc-01", "--history", str(hist))
    rc, doc = run_cli(capsys, *args)
    first = by_key(doc)[("gpu.xid", "dc-01", "GPU2")]
    assert rc == 2 and "recurred" not in first["message"]  # nothing known of earlier boots yet
    record = json.loads(hist.read_text())
    assert record["memory"]["gpu.xid"]["dc-01"]["GPU2"]["boots"] == {"GPU2": {"79": [boot]}}
    record["memory"]["gpu.xid"]["dc-01"]["GPU2"]["boots"]["GPU2"]["79"] = [boot - 86400]  # seen in the boot before
    hist.write_text(json.dumps(record) + "\n")
    rc, doc = run_cli(capsys, *args)
    again = by_key(doc)[("gpu.xid", "dc-01", "GPU2")]
    assert rc == 2 and again["status"] == "fail" and "recurred after a reboot: XID 79" in again["message"]
    assert "inspect the hardware" in again["remedy"]
    assert json.loads(hist.read_text().splitlines()[-1])["memory"]["gpu.xid"]["dc-01"]["GPU2"]["boots"] == {
        "GPU2": {"79": [boot - 86400, boot]}}


def test_board_checks_over_real_sshd_and_the_replay_rate_from_the_history(  # type: ignore[no-untyped-def]
    fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pf-01 prints the HAND-EDITED capture (one fault per GPU) and a corrupted-InfoROM warning (exit 14)."""
    cluster, profile = fleet
    xml = FIX / "nvidia-smi-qx" / "HAND-EDITED-h100x8-580.105.08-fabric-power-hbm-vbios.xml"
    standin_gpu_node(cluster, "pf-01", xml)
    bin_dir = cluster.bin_dir("pf-01")
    cluster.add_executable("pf-01", "nvidia-smi", (
        f'case "$1 $2" in\n  "-q -x") cat {xml}; echo "WARNING: infoROM is corrupted at gpu 0000:53:00.0"; exit 14 ;;\n'
        f'  "nvlink -s") cat {bin_dir / "nvlink-s.txt"} ;;\n  *) : ;;\nesac\n'))
    hist = tmp_path / "audit.jsonl"
    args = ("audit", "-p", str(profile), "--json", "--only", "gpu", "--nodes", "pf-01", "--history", str(hist))
    rc, doc = run_cli(capsys, *args)
    f = by_key(doc)
    assert rc == 2
    # In Progress: a warning while the fabric manager may still be training, a failure long after boot
    settling = time.time() - _btime() < 600
    assert f[("gpu.fabric", "pf-01", "GPU1")]["status"] == ("warn" if settling else "fail")
    assert f[("gpu.power_limit", "pf-01", "GPU2")]["status"] == "warn"
    assert f[("gpu.memory_temp", "pf-01", "GPU4")]["status"] == "fail"
    assert f[("gpu.vbios", "pf-01", "node")]["status"] == "warn"
    assert f[("gpu.inforom", "pf-01", "GPU0")]["status"] == "warn" and f[("gpu.inforom", "pf-01", "GPU0")]["code"] == "IC-GPU-026"
    assert f[("gpu.pcie_replay", "pf-01", "GPU0")]["status"] == "ok"  # no earlier audit: no rate yet
    # the previous audit's sample, as if it had been taken a minute ago with no replays yet
    record = json.loads(hist.read_text())
    sample = record["memory"]["gpu.pcie_replay"]["pf-01"]["GPU0"]
    assert sample["replays"] == 150 and sample["boot_time"] == _btime()
    sample.update({"replays": 0, "at": sample["at"] - 60})
    hist.write_text(json.dumps(record) + "\n")
    rc, doc = run_cli(capsys, *args)
    replay = by_key(doc)[("gpu.pcie_replay", "pf-01", "GPU0")]
    assert replay["status"] == "warn" and "above 31/min for Gen5 x16" in replay["message"]
