"""XIDs since the last boot: real kernel-log captures (tests/fixtures/kernel-xid),
stamped ISO (journal) or with dmesg's seconds since boot, judged against a boot time; XIDs of earlier
boots are listed, not judged; a fatal XID that comes back after a reboot is escalated to hardware
inspection, from the journal or from what an earlier audit remembered."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from infer_ctl.core.findings import Status
from infer_ctl.core.gpu import rules
from infer_ctl.core.gpu.facts import GpuFacts, NodeGpuFacts, XidEvent
from infer_ctl.facts.kernel_log import event_epoch, parse_sxids, parse_xids
from infer_ctl.profile.gpu import GpuPolicy

KX = Path(__file__).parents[1] / "fixtures" / "kernel-xid"
P = GpuPolicy()
# GPU3 at 0000:19:00, the GPU of the gpud xid48/63/94 capture (dmesg --time-format=iso)
GPU = GpuFacts(index=3, pci_bus_id="00000000:19:00.0")
DBE_CAPTURE = (KX / "gpud-xid48-63-94-dbe-rowremap-contained.txt").read_text()
DBE_AT = datetime.fromisoformat("2024-11-15T12:02:03,470068+00:00").timestamp()  # its XID 48 line


def _facts(text: str, boot: float | None, now: float | None, **kw) -> NodeGpuFacts:  # type: ignore[no-untyped-def]
    return NodeGpuFacts(source="nvml", gpus=(GPU,), gpu_count=1, xids=tuple(parse_xids(text, boot)),
                        sxids=tuple(parse_sxids(text, boot)), xid_source="journalctl", boot_time=boot,
                        gathered_at=now, **kw)


def _by_subject(findings):  # type: ignore[no-untyped-def]
    return {f.subject: f for f in findings}


def test_stamps_become_unix_time_iso_with_zone_and_dmesg_seconds_since_boot() -> None:
    assert event_epoch("2024-11-15T12:02:03,470068+00:00") == DBE_AT
    assert event_epoch("2025-03-01T10:00:00+0000") == datetime.fromisoformat("2025-03-01T10:00:00+00:00").timestamp()
    assert event_epoch("1843.308145", boot_time=1_700_000_000) == pytest.approx(1_700_001_843.308145)
    assert event_epoch("1843.308145") is None  # no boot time: no time
    assert event_epoch("Feb 14 05:03:42") is None and event_epoch("Sun Feb 23 16:24:18 2025") is None  # no zone
    (fallen,) = parse_xids((KX / "nvsentinel-issue155-fallen-off-bus-no-xid-570.txt").read_text(), 1_700_000_000)
    assert fallen.epoch == pytest.approx(1_700_001_843.308145)


def test_a_node_rebooted_after_its_xids_is_ok_and_lists_them() -> None:
    # the capture's XID 48/63/94 happened; the node was rebooted an hour later as the remedy says
    findings = _by_subject(rules.judge_xids("n1", _facts(DBE_CAPTURE, DBE_AT + 3600, DBE_AT + 7200), P))
    assert findings["GPU3"].status is Status.OK and "before the last boot" in findings["GPU3"].message
    assert findings["GPU3"].details["before_boot"] == {"48": 1, "63": 1, "94": 9}
    assert findings["node"].status is Status.OK and "since the last boot" in findings["node"].message
    # the same lines with the node not rebooted since: XID 48 is fatal now
    findings = _by_subject(rules.judge_xids("n1", _facts(DBE_CAPTURE, DBE_AT - 86400, DBE_AT + 600), P))
    assert findings["GPU3"].status is Status.FAIL and "since the last boot" in findings["GPU3"].message
    assert "node" not in findings


def test_dmesg_has_no_window_of_its_own() -> None:
    text = (KX / "nvsentinel-issue155-fallen-off-bus-no-xid-570.txt").read_text()  # [1843.308145] XID 79
    node = GpuFacts(index=0, pci_bus_id="00000000:b3:00.0")
    boot = 1_700_000_000.0
    recent = NodeGpuFacts(source="nvml", gpus=(node,), xids=tuple(parse_xids(text, boot)), xid_source="dmesg",
                          boot_time=boot, gathered_at=boot + 1843 + 600)
    assert _by_subject(rules.judge_xids("n1", recent, P))["GPU0"].status is Status.FAIL
    # three days later, same boot: the XID is older than the 24 h window
    old = NodeGpuFacts(source="nvml", gpus=(node,), xids=tuple(parse_xids(text, boot)), xid_source="dmesg",
                       boot_time=boot, gathered_at=boot + 3 * 86400)
    assert {f.subject: f.status for f in rules.judge_xids("n1", old, P)} == {"node": Status.OK}


def _line(epoch: float, xid: int = 79, pci: str = "0000:19:00") -> str:
    stamp = datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")
    return f"{stamp} node kernel: NVRM: Xid (PCI:{pci}): {xid}, pid=1, name=python3, GPU has fallen off the bus.\n"


def test_a_fatal_xid_back_after_a_reboot_is_escalated_to_hardware_inspection() -> None:
    boot = 1_800_000_000.0
    text = _line(boot - 3600) + _line(boot + 600)  # before the reboot, and again after it
    (f, *_) = rules.judge_xids("n1", _facts(text, boot, boot + 700), P)
    assert f.status is Status.FAIL and "recurred after a reboot: XID 79" in f.message
    assert f.details["recurred_after_reboot"] == {"79": 1} and f.details["before_boot"] == {"79": 1}
    assert "a reboot does not clear it" in (f.remedy or "") and "inspect the hardware" in (f.remedy or "")
    # gpud's default needs two reboots
    (f, *_) = rules.judge_xids("n1", _facts(text, boot, boot + 700), P.model_copy(update={"xid_reboot_threshold": 2}))
    assert f.status is Status.FAIL and f.details["recurred_after_reboot"] == {} and "recurred" not in f.message
    # XID 94 is an application error: never escalated (and only a warning)
    (f, *_) = rules.judge_xids("n1", _facts(_line(boot - 3600, 94) + _line(boot + 600, 94), boot, boot + 700), P)
    assert f.status is Status.WARN and f.details["recurred_after_reboot"] == {}


def test_the_audit_history_remembers_xids_of_boots_the_journal_no_longer_has() -> None:
    boot1, boot2 = 1_800_000_000.0, 1_800_090_000.0
    first = rules.judge_xids("n1", _facts(_line(boot1 + 600), boot1, boot1 + 700), P)
    memory = json.loads(json.dumps(first[0].details["memory"]))  # as the history line stores it
    assert memory["boots"] == {"GPU3": {"79": [boot1]}}
    # rebooted; a volatile journal holds only this boot: no XID yet -> OK, memory kept
    quiet = rules.judge_xids("n1", _facts("", boot2, boot2 + 100), P, [memory])
    assert [f.status for f in quiet] == [Status.OK] and quiet[0].details["memory"]["boots"] == memory["boots"]
    # XID 79 again on the same GPU: escalated from what the history remembered
    again = rules.judge_xids("n1", _facts(_line(boot2 + 600), boot2, boot2 + 700), P, [memory])
    assert again[0].status is Status.FAIL and again[0].details["recurred_after_reboot"] == {"79": 1}
    assert again[0].details["memory"]["boots"] == {"GPU3": {"79": [boot1, boot2]}}
    # the same boot seen twice is not a recurrence
    same = rules.judge_xids("n1", _facts(_line(boot1 + 900), boot1 + 1, boot1 + 1000), P, [memory])
    assert same[0].details["recurred_after_reboot"] == {}


def test_xid_events_without_time_count_as_since_the_boot() -> None:
    facts = NodeGpuFacts(source="nvml", gpus=(GPU,), xids=(XidEvent(79, "0000:19:00", "fallen"),), boot_time=1.0e9,
                         gathered_at=1.0e9 + 10)
    assert rules.judge_xids("n1", facts, P)[0].status is Status.FAIL


def test_nvswitch_sxids_since_the_boot_fail_when_fatal() -> None:
    text = (KX / "gpud-sxid-readme-xid79-sxid20034-nvswitch.txt").read_text()  # [6781753.4] stamps
    boot = 1_700_000_000.0
    facts = _facts(text, boot, boot + 6781753 + 600)
    findings = _by_subject(rules.judge_sxids("n1", facts, P))
    assert set(findings) == {"NVSwitch PCI:0000:05:00.0", "NVSwitch PCI:0000:06:00.0", "NVSwitch PCI:0000:07:00.0"}
    sw0 = findings["NVSwitch PCI:0000:05:00.0"]
    assert sw0.status is Status.FAIL and sw0.check == "gpu.sxid" and "SXid 20034 x2" in sw0.message
    assert "reboot" in (sw0.remedy or "")
    nonfatal = "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error\n"
    (warn,) = rules.judge_sxids("n1", _facts(nonfatal, boot, boot + 100), P)
    assert warn.status is Status.WARN and "non-fatal SXid 12028" in warn.message
    # a node rebooted since: the SXids are from the boot before
    (ok,) = rules.judge_sxids("n1", _facts(_line(boot - 60).replace(
        "NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=python3, GPU has fallen off the bus.",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up"), boot, boot + 100), P)
    assert ok.status is Status.OK and "before the last boot" in ok.message
    # no NVSwitch lines at all: nothing to say
    assert rules.judge_sxids("n1", _facts("", boot, boot + 100), P) == []
    # and judge_node includes them
    assert any(f.check == "gpu.sxid" for f in rules.judge_node("n1", facts, P, 1))
