"""XIDs and NVSwitch SXids from the kernel log: pure parsers of what the node-side gatherer read.

Lines look like `NVRM: Xid (PCI:0000:9b:00): 119, pid=..., name=..., <text>` (gpud's regex), with any
prefix (`[ 3606.83]`, `Feb 14 05:03:41 host kernel:`, `kern :warn : 2025-01-21T02:21:33,49+00:00`).
"GPU ... has fallen off the bus" is reported by the driver without an XID number, over several lines;
like gpud we report it as XID 79 so it gets XID 79's severity.

Each event gets a Unix time when its stamp allows one: an ISO stamp with a zone (journalctl -o short-iso,
dmesg --time-format=iso), or dmesg's `[seconds since boot]` plus the node's boot time (/proc/stat btime).
Syslog (`Feb 14 05:03:41`) and `dmesg -T` stamps carry no zone and no year: no time, and the judge counts
such an event as "since the last boot" rather than guessing.

SXid lines (NVSwitch driver; gpud components/accelerator/nvidia/sxid/kmsg.go, NVIDIA Fabric Manager User
Guide "NVSwitch SXid errors"): `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 ...`.
The driver prints several lines per error (severity, `Severity 1 Engine instance ...`, `Data {...}`); only
the line naming the severity (Fatal / Non-fatal) counts as the event.
"""

from __future__ import annotations

import re
from datetime import datetime

from infer_ctl.core.gpu.facts import SxidEvent, XidEvent

_XID = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)\).*?: (\d+),\s*(.*)$")
_FALLEN_GPU = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F:.]+)")
# the driver's own follow-up of an XID 79 line: "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."
_FALLEN_AFTER_XID = re.compile(r"NVRM: GPU ([0-9a-fA-F]+:[0-9a-fA-F:.]+): GPU has fallen off the bus")
_FALLEN = re.compile(r"fallen off the bus", re.IGNORECASE)
_ISO_TS = re.compile(r"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}[,.\d]*(?:[+-]\d{2}:?\d{2}|Z)?)")
_SYSLOG_TS = re.compile(r"^([A-Z][a-z]{2} +\d+ \d{2}:\d{2}:\d{2})")
_DMESG_TS = re.compile(r"^\[\s*([^\]]+)\]")


def _timestamp(line: str, upto: int) -> str | None:
    head = line[:upto]
    for pattern in (_ISO_TS, _SYSLOG_TS, _DMESG_TS):
        m = pattern.search(head)
        if m:
            return m.group(1).strip()
    return None


_MONOTONIC = re.compile(r"^\d+(?:\.\d+)?$")


def event_epoch(timestamp: str | None, boot_time: float | None = None) -> float | None:
    """Unix time of a kernel-log stamp: ISO with a zone, or dmesg's seconds since boot + `boot_time`."""
    if not timestamp:
        return None
    text = timestamp.strip()
    if _MONOTONIC.match(text):
        return boot_time + float(text) if boot_time is not None else None
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        return None
    return stamp.timestamp() if stamp.tzinfo is not None else None


def parse_xids(text: str, boot_time: float | None = None) -> list[XidEvent]:
    """Every XID event in a kernel log excerpt, in order. Lines that are not XIDs are ignored."""
    events: list[XidEvent] = []
    pending_fallen: tuple[str, str | None] | None = None  # (pci, timestamp) of an open "The NVIDIA GPU" block
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            pci = m.group(1).lower().removeprefix("pci:")
            ts = _timestamp(line, m.start())
            events.append(
                XidEvent(
                    xid=int(m.group(2)),
                    pci=pci,
                    message=m.group(3).strip(),
                    timestamp=ts,
                    epoch=event_epoch(ts, boot_time),
                )
            )
            continue
        fm = _FALLEN_GPU.search(line)
        if fm:
            pending_fallen = (fm.group(1).lower(), _timestamp(line, fm.start()))
            if not _FALLEN.search(line):
                continue
        if _FALLEN.search(line):
            after = _FALLEN_AFTER_XID.search(line)
            if after and events and events[-1].xid == 79 and not events[-1].synthetic \
                    and _same_gpu(events[-1].pci, after.group(1)):
                continue  # the text that follows an XID 79 line: the same event
            pci, ts = pending_fallen if pending_fallen else (
                (after.group(1).lower() if after else None), _timestamp(line, len(line)))
            events.append(
                XidEvent(
                    xid=79,
                    pci=pci,
                    message="GPU has fallen off the bus and is not responding to commands",
                    timestamp=ts,
                    synthetic=True,
                    epoch=event_epoch(ts, boot_time),
                )
            )
            pending_fallen = None
    return events


def _same_gpu(a: str | None, b: str | None) -> bool:
    """'0000:91:00' (XID lines) and '0000:91:00.0' (other NVRM lines) name the same GPU."""
    def key(x: str | None) -> str | None:
        return x.lower().removeprefix("pci:").split(".")[0] if x else None
    return key(a) is not None and key(a) == key(b)


_SXID = re.compile(r"SXid \((?:PCI:)?([0-9a-fA-F:.]+)\)\s*:\s*(\d+),\s*(Fatal|Non-fatal)\b,?\s*(.*)$", re.IGNORECASE)


def parse_sxids(text: str, boot_time: float | None = None) -> list[SxidEvent]:
    """Every NVSwitch SXid error (its severity line) in a kernel log excerpt, in order."""
    events: list[SxidEvent] = []
    for line in text.splitlines():
        m = _SXID.search(line)
        if m:
            ts = _timestamp(line, m.start())
            events.append(SxidEvent(
                sxid=int(m.group(2)), pci=m.group(1).lower(), severity=m.group(3).lower(),
                message=m.group(4).strip(), timestamp=ts, epoch=event_epoch(ts, boot_time),
            ))
    return events


def split_source(text: str) -> tuple[str | None, str]:
    """The `#source <name>` header a producer may write, and the log body."""
    first, _, rest = text.partition("\n")
    if first.startswith("#source "):
        return first.removeprefix("#source ").strip(), rest
    return None, text
