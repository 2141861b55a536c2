"""XID parsing on real kernel-log excerpts (tests/fixtures/kernel-xid; provenance in README.md there)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from infer_ctl.facts.kernel_log import parse_xids, split_source

KX = Path(__file__).parents[1] / "fixtures" / "kernel-xid"

CASES = [
    # file, XID counts, (first pci, first timestamp)
    ("gpud-xid119-gsp-rpc-timeout-h100-dell-xe9680.txt", {119: 5}, ("0000:9b:00", "Sun Feb 23 16:24:18 2025")),
    ("gpud-xid13-43-graphics-exceptions-decode-iso.txt", {13: 629, 43: 7}, ("0000:38:00", "2025-01-21T02:21:33,498559+00:00")),
    ("gpud-xid48-63-94-dbe-rowremap-contained.txt", {48: 1, 63: 1, 94: 9}, ("0000:19:00", "2024-11-15T12:02:03,470068+00:00")),
    ("ogkm-issue1150-xid45-caused-by-xid145-149-590.txt", {45: 7}, ("0000:dc:00", None)),
    ("stas00-xid63-row-remapper-a100.txt", {63: 1}, ("0000:10:1c", None)),
    # "fallen off the bus" without an XID line, over several lines: reported as XID 79
    ("gpud-pr1209-b200-fallen-off-bus-multiline-journalctl.txt", {79: 1}, ("0000:18:00.0", "Feb 14 05:03:42")),
    ("nvsentinel-issue155-fallen-off-bus-no-xid-570.txt", {79: 1}, ("0000:b3:00.0", "1843.308145")),
]


@pytest.mark.parametrize(("name", "counts", "first"), CASES, ids=[c[0] for c in CASES])
def test_xids(name: str, counts: dict[int, int], first: tuple[str, str | None]) -> None:
    events = parse_xids((KX / name).read_text())
    assert Counter(e.xid for e in events) == counts
    assert (events[0].pci, events[0].timestamp) == first


def test_xid_message_keeps_the_driver_text() -> None:
    (event,) = parse_xids((KX / "stas00-xid63-row-remapper-a100.txt").read_text())
    assert "Row Remapper" in event.message and not event.synthetic


def test_synthetic_xid79_is_marked() -> None:
    (event,) = parse_xids((KX / "nvsentinel-issue155-fallen-off-bus-no-xid-570.txt").read_text())
    assert event.synthetic and "fallen off the bus" in event.message


def test_unrelated_lines_yield_nothing() -> None:
    assert parse_xids("kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE\nNVRM: loading NVIDIA UNIX\n") == []


def test_split_source() -> None:
    assert split_source("#source dmesg\nline\n") == ("dmesg", "line\n")
    assert split_source("line\n") == (None, "line\n")


def test_sxids_of_a_real_nvswitch_capture() -> None:
    """gpud's sxid README capture: fatal SXid 20034 on three NVSwitches; continuation lines are no events."""
    from infer_ctl.facts.kernel_log import parse_sxids

    text = (KX / "gpud-sxid-readme-xid79-sxid20034-nvswitch.txt").read_text()
    events = parse_sxids(text, boot_time=1_000_000.0)
    assert [(e.pci, e.sxid, e.severity) for e in events] == [
        ("0000:06:00.0", 20034, "fatal"), ("0000:05:00.0", 20034, "fatal"),
        ("0000:07:00.0", 20034, "fatal"), ("0000:05:00.0", 20034, "fatal")]
    assert events[0].message == "Link 48 LTSSM Fault Up" and events[0].epoch == 1_000_000.0 + 6781753.400584
    assert [e.xid for e in parse_xids(text)] == [79]  # the GPU's own line is an XID, not an SXid
