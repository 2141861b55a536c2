"""XIDs from the kernel log: the command that reads it (since a window) and a pure parser.

Lines look like `NVRM: Xid (PCI:0000:9b:00): 119, pid=..., name=..., <text>` (gpud's regex), with any
prefix (`[ 3606.83]`, `Feb 14 05:03:41 host kernel:`, `kern :warn : 2025-01-21T02:21:33,49+00:00`).
"GPU ... has fallen off the bus" is reported by the driver without an XID number, over several lines;
like gpud we report it as XID 79 so it gets XID 79's severity.
"""

from __future__ import annotations

import re

from infer_ctl.core.gpu.facts import XidEvent

_XID = re.compile(r"NVRM: Xid \(((?:PCI:)?[0-9a-fA-F:.]+)\).*?: (\d+),\s*(.*)$")
_FALLEN_GPU = re.compile(r"NVRM: The NVIDIA GPU ([0-9a-fA-F:.]+)")
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


def parse_xids(text: str) -> list[XidEvent]:
    """Every XID event in a kernel log excerpt, in order. Lines that are not XIDs are ignored."""
    events: list[XidEvent] = []
    pending_fallen: tuple[str, str | None] | None = None  # (pci, timestamp) of an open "The NVIDIA GPU" block
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            pci = m.group(1).lower().removeprefix("pci:")
            events.append(
                XidEvent(
                    xid=int(m.group(2)),
                    pci=pci,
                    message=m.group(3).strip(),
                    timestamp=_timestamp(line, m.start()),
                )
            )
            continue
        fm = _FALLEN_GPU.search(line)
        if fm:
            pending_fallen = (fm.group(1).lower(), _timestamp(line, fm.start()))
            if not _FALLEN.search(line):
                continue
        if _FALLEN.search(line):
            pci, ts = pending_fallen if pending_fallen else (None, _timestamp(line, len(line)))
            events.append(
                XidEvent(
                    xid=79,
                    pci=pci,
                    message="GPU has fallen off the bus and is not responding to commands",
                    timestamp=ts,
                    synthetic=True,
                )
            )
            pending_fallen = None
    return events


def split_source(text: str) -> tuple[str | None, str]:
    """The `#source <name>` header a producer may write, and the log body."""
    first, _, rest = text.partition("\n")
    if first.startswith("#source "):
        return first.removeprefix("#source ").strip(), rest
    return None, text
