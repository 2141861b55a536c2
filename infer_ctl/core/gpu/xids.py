"""XIDs and NVSwitch SXids from the kernel log: which ones count now, their severity, and recurrence.

"Now" is since the node's last boot and within `gpu.xid_window_h`: the XID 79 remedy is "drain and
reboot", and a node rebooted as told must not stay FAIL for the rest of the window. XIDs of earlier boots
(journalctl --since spans reboots) are listed, not judged. dmesg has no window of its own: its events
carry seconds since boot, which the parser turned into Unix time with the boot time, and the window is
applied here.

A fatal XID that comes back after a reboot on the same GPU is escalated from "reboot" to "inspect the
hardware", as gpud does (components/accelerator/nvidia/xid/health_state.go, evolveHealthyState, gpud
commit 4a8de33a: a reboot clears a RebootSystem XID; when the same XID shows up again after
`rebootThreshold` reboots the action becomes HardwareInspection; threshold.go exempts XID 94, an
application error). inferctl's threshold is `gpu.xid_reboot_threshold` (default 1: the first recurrence
after a reboot; gpud's default is 2). Earlier boots are known from the kernel log itself (the persistent
journal) and from the audit history: each run remembers, per GPU and XID, the boots it was seen in
(`details["memory"]` of the node's first gpu.xid finding; checks/audit.py keeps it between runs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.facts import NodeGpuFacts, SxidEvent, XidEvent, normalise_pci
from infer_ctl.profile.gpu import GpuPolicy

RMA = "drain the node and open an RMA with the GPU's serial number"
#: /proc/stat btime is whole seconds and moves by a second with clock steps: events this close before it
#: still count as this boot
BOOT_SLACK_S = 2.0
#: two boot times closer than this are the same boot
SAME_BOOT_S = 60.0
#: how long and how many boots the history remembers per GPU and XID
MEMORY_DAYS = 30
MEMORY_BOOTS = 10
#: never escalated after a reboot (gpud threshold.go: XID 94 is contained to the application)
NO_ESCALATION = frozenset({94})

_XID_REMEDY = {
    79: f"the GPU fell off the bus: drain the node and reboot it; if it recurs, reseat or {RMA}",
    48: "double-bit ECC error: drain the node and reset the GPU; check `gpu.row_remap`",
    61: "internal micro-controller breakpoint/warning (thermal/EDPp): watch `gpu.temperature` and `gpu.throttle`; "
        "reset the GPU if it repeats",
    62: "internal micro-controller halt (thermal): check cooling; reset the GPU if it repeats",
    63: "row remap/page retirement pending: `gpu.row_remap` says whether a reset is due; drain and reset the GPU then",
    64: f"row remapping failed: {RMA}",
    74: "NVLink error: drain the node, reset the GPUs and check the NVLink/fabric manager",
    92: "high single-bit ECC rate: watch `gpu.ecc_errors`; plan a reset",
    94: "contained ECC error: restart the affected application; reset the GPU when drained",
    95: "uncontained ECC error: drain the node and reset the GPU",
    119: "GSP RPC timeout: drain the node and reset the GPU or reboot; update the driver if it recurs",
    120: "GSP error: drain the node and reset the GPU or reboot; update the driver if it recurs",
}


def xid_rule(xid: int, policy: GpuPolicy) -> tuple[str, str]:
    """(severity, the profile field that decided it): fatal | warn | ignore. First match wins:
    xid_overrides, ignore_xids, fatal_xids, warn_xids; an XID in none of them warns ("unlisted")."""
    if xid in policy.xid_overrides:
        return policy.xid_overrides[xid], "xid_overrides"
    if xid in policy.ignore_xids:
        return "ignore", "ignore_xids"
    if xid in policy.fatal_xids:
        return "fatal", "fatal_xids"
    if xid in policy.warn_xids:
        return "warn", "warn_xids"
    return "warn", "unlisted"


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "?"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _period(facts: NodeGpuFacts, policy: GpuPolicy) -> str:
    window = f"{policy.xid_window_h:g} h"
    if facts.boot_time is None:
        return f"in the last {window}"
    return f"since the last boot ({_when(facts.boot_time)}, within {window})"


def split_by_boot(
    events: Iterable[Any], boot_time: float | None, now: float | None, window_h: float
) -> tuple[list[Any], list[Any]]:
    """(since the last boot, earlier boots) of events with an `epoch`, both within the window; an event
    without a time counts as since the last boot (the safe side: it is judged)."""
    current, earlier = [], []
    for e in events:
        if e.epoch is not None and now is not None and e.epoch < now - window_h * 3600:
            continue  # dmesg: no window of its own
        if e.epoch is not None and boot_time is not None and e.epoch < boot_time - BOOT_SLACK_S:
            earlier.append(e)
        else:
            current.append(e)
    return current, earlier


# ---- what the history remembers ----------------------------------------------------------------------
def remembered_boots(history: Iterable[Mapping[str, Any]] | None) -> dict[str, dict[str, list[float]]]:
    """{subject: {xid: [boot times]}} from the node's remembered gpu.xid blobs (any of its subjects)."""
    out: dict[str, dict[str, list[float]]] = {}
    for blob in history or ():
        boots = blob.get("boots") if isinstance(blob, Mapping) else None
        if not isinstance(boots, Mapping):
            continue
        for subject, xids in boots.items():
            if not isinstance(xids, Mapping):
                continue
            for xid, times in xids.items():
                merged = out.setdefault(str(subject), {}).setdefault(str(xid), [])
                for t in times if isinstance(times, list) else ():
                    if isinstance(t, int | float) and not any(abs(t - m) < SAME_BOOT_S for m in merged):
                        merged.append(float(t))
    return out


def _memory(boots: dict[str, dict[str, list[float]]], current: dict[str, set[int]], facts: NodeGpuFacts) -> dict[str, Any]:
    """The blob this run leaves: earlier boots plus this boot for every XID seen since it, pruned."""
    out: dict[str, dict[str, list[float]]] = {s: {x: list(t) for x, t in xs.items()} for s, xs in boots.items()}
    if facts.boot_time is not None:
        for subject, xids in current.items():
            for xid in xids:
                times = out.setdefault(subject, {}).setdefault(str(xid), [])
                if not any(abs(facts.boot_time - t) < SAME_BOOT_S for t in times):
                    times.append(facts.boot_time)
    horizon = (facts.gathered_at or facts.boot_time or 0.0) - MEMORY_DAYS * 86400
    pruned = {s: {x: sorted(t for t in ts if t >= horizon)[-MEMORY_BOOTS:] for x, ts in xs.items()} for s, xs in out.items()}
    return {"boot_time": facts.boot_time,
            "boots": {s: {x: ts for x, ts in xs.items() if ts} for s, xs in pruned.items() if any(xs.values())}}


def _earlier_boots(xid: int, subject: str, boots: dict[str, dict[str, list[float]]], earlier: list[XidEvent],
                   boot_time: float | None) -> int:
    """In how many boots before this one the GPU had this XID: the history's boots, or at least one when
    the journal shows it before the last boot."""
    known = [t for t in boots.get(subject, {}).get(str(xid), [])
             if boot_time is None or t < boot_time - SAME_BOOT_S]
    if known:
        return len(known)
    return 1 if any(e.xid == xid for e in earlier) else 0


# ---- the judgement -------------------------------------------------------------------------------------
def _subject(facts: NodeGpuFacts, pci: str | None) -> str:
    gpu = facts.gpu_for_pci(pci)
    return gpu.subject if gpu else f"PCI:{normalise_pci(pci) or pci or '?'}"


def judge_xids(node: str, facts: NodeGpuFacts, policy: GpuPolicy,
               history: Iterable[Mapping[str, Any]] | None = None) -> list[Finding]:
    """gpu.xid findings of one node; `history`: the node's remembered gpu.xid blobs of earlier audits."""
    period = _period(facts, policy)
    if facts.xids is None:
        # when the whole gathering failed (timeout, crash) the kernel log was never tried: point at that
        # failure instead of at journal permissions
        whole = facts.error is not None and facts.xid_error == facts.error
        return [
            Finding.unknown(
                "gpu.xid", node, "node",
                f"kernel log not read: {facts.xid_error}" if whole else f"kernel log not readable: {facts.xid_error}",
                remedy="see this node's gpu.driver finding: GPU facts were not gathered at all" if whole else
                "add the SSH user to the `adm` or `systemd-journal` group (journalctl -k), or allow "
                "dmesg (sysctl kernel.dmesg_restrict=0)",
            )
        ]
    boots = remembered_boots(history)
    relevant = [e for e in facts.xids if xid_rule(e.xid, policy)[0] != "ignore"]
    current, earlier = split_by_boot(relevant, facts.boot_time, facts.gathered_at, policy.xid_window_h)
    now_by: dict[str, list[XidEvent]] = {}
    before_by: dict[str, list[XidEvent]] = {}
    for e in current:
        now_by.setdefault(_subject(facts, e.pci), []).append(e)
    for e in earlier:
        before_by.setdefault(_subject(facts, e.pci), []).append(e)
    findings: list[Finding] = []
    for subject in sorted(set(now_by) | set(before_by)):
        events, before = now_by.get(subject, []), before_by.get(subject, [])
        if events:
            findings.append(_judge_subject(node, subject, events, before, boots, facts, policy, period))
        else:
            counts = Counter(e.xid for e in before)
            listing = ", ".join(f"XID {k}" + (f" x{v}" if v > 1 else "") for k, v in sorted(counts.items()))
            findings.append(Finding.ok(
                "gpu.xid", node, subject,
                f"{listing} before the last boot ({_when(facts.boot_time)}), none since",
                details={"before_boot": {str(k): v for k, v in sorted(counts.items())},
                         "last_before_boot": _event_dict(before[-1]), "source": facts.xid_source,
                         "boot_time": facts.boot_time, "window_h": policy.xid_window_h},
            ))
    if not any(f.status.value != "ok" for f in findings):
        findings.append(Finding.ok("gpu.xid", node, "node", f"no XIDs {period}",
                                   details={"source": facts.xid_source, "ignored": len(facts.xids) - len(relevant),
                                            "boot_time": facts.boot_time, "window_h": policy.xid_window_h}))
    memory = _memory(boots, {s: {e.xid for e in evs} for s, evs in now_by.items()}, facts)
    findings[0] = replace(findings[0], details={**findings[0].details, "memory": memory})
    return findings


def _event_dict(e: XidEvent) -> dict[str, Any]:
    return {"xid": e.xid, "message": e.message, "timestamp": e.timestamp, "pci": e.pci}


def _judge_subject(node: str, subject: str, events: list[XidEvent], before: list[XidEvent],
                   boots: dict[str, dict[str, list[float]]], facts: NodeGpuFacts, policy: GpuPolicy,
                   period: str) -> Finding:
    rules_of = {e.xid: xid_rule(e.xid, policy) for e in events}
    fatal = [e for e in events if rules_of[e.xid][0] == "fatal"]
    last = (fatal or events)[-1]
    counts = Counter(e.xid for e in events)
    recurred = {
        x: n for x in sorted({e.xid for e in fatal}) if x not in NO_ESCALATION
        and (n := _earlier_boots(x, subject, boots, before, facts.boot_time)) >= policy.xid_reboot_threshold
    }
    details: dict[str, Any] = {
        "xids": {str(k): v for k, v in sorted(counts.items())},
        "last": _event_dict(last),
        "source": facts.xid_source,
        "window_h": policy.xid_window_h,
        "boot_time": facts.boot_time,
        # which profile field made each XID fatal/warn (`unlisted`: in none of the lists)
        "classified_by": {str(k): rules_of[k][1] for k in sorted(counts)},
        "before_boot": {str(k): v for k, v in sorted(Counter(e.xid for e in before).items())},
        # XID -> earlier boots it was seen in: a reboot did not clear it
        "recurred_after_reboot": {str(k): v for k, v in recurred.items()},
    }
    listing = ", ".join(f"XID {k}" + (f" x{v}" if v > 1 else "") for k, v in sorted(counts.items()))
    remedy = _XID_REMEDY.get(last.xid, "look the XID up in NVIDIA's XID catalog; restart the affected "
                             "application, reset the GPU if it repeats")
    if recurred:
        names = ", ".join(f"XID {x}" for x in recurred)
        boots_seen = max(recurred.values())
        remedy = (f"{names} came back after {boots_seen} reboot{'s' if boots_seen > 1 else ''}: a reboot does not clear "
                  f"it. Drain the node and inspect the hardware (reseat the GPU, its riser and power cables; "
                  f"{RMA} if it persists)")
    unlisted = sorted(k for k in counts if rules_of[k][1] == "unlisted")
    if unlisted:
        names = ", ".join(map(str, unlisted))
        remedy += (f". XID {names} is in none of gpu.fatal_xids/warn_xids/ignore_xids, so it only warns: "
                   "add it to the list it belongs in")
    if fatal:
        again = f" (recurred after a reboot: {', '.join(f'XID {x}' for x in recurred)})" if recurred else ""
        return Finding.fail("gpu.xid", node, subject, f"{listing} {period}{again}: {last.message}",
                            details=details, remedy=remedy)
    return Finding.warn("gpu.xid", node, subject, f"{listing} {period}", details=details, remedy=remedy)


def judge_sxids(node: str, facts: NodeGpuFacts, policy: GpuPolicy) -> list[Finding]:
    """gpu.sxid: NVSwitch errors since the last boot, per NVSwitch. A Fatal SXid needs the GPUs and
    NVSwitches reset (reboot the node; inspect the NVSwitch baseboard if it returns: Fabric Manager User
    Guide, "NVSwitch SXid errors"); Non-fatal ones warn. Nothing is said on nodes without NVSwitch lines,
    and an unreadable kernel log is gpu.xid's UNKNOWN already."""
    if facts.sxids is None:
        return []
    current, earlier = split_by_boot(facts.sxids, facts.boot_time, facts.gathered_at, policy.xid_window_h)
    if not current and not earlier:
        return []
    period = _period(facts, policy)
    by: dict[str, list[SxidEvent]] = {}
    for e in current:
        by.setdefault(f"NVSwitch PCI:{e.pci or '?'}", []).append(e)
    findings: list[Finding] = []
    for subject, events in sorted(by.items()):
        fatal = [e for e in events if e.severity == "fatal"]
        last = (fatal or events)[-1]
        counts = Counter(e.sxid for e in events)
        listing = ", ".join(f"SXid {k}" + (f" x{v}" if v > 1 else "") for k, v in sorted(counts.items()))
        details = {"sxids": {str(k): v for k, v in sorted(counts.items())}, "fatal": len(fatal),
                   "last": {"sxid": last.sxid, "severity": last.severity, "message": last.message,
                            "timestamp": last.timestamp, "pci": last.pci},
                   "source": facts.xid_source, "boot_time": facts.boot_time}
        if fatal:
            findings.append(Finding.fail(
                "gpu.sxid", node, subject, f"fatal {listing} {period}: {last.message}", details=details,
                remedy="a fatal NVSwitch error: drain the node and reboot it to reset the GPUs and NVSwitches "
                       "(check `journalctl -u nvidia-fabricmanager`); if the same SXid returns, have the NVSwitch "
                       "baseboard inspected"))
        else:
            findings.append(Finding.warn(
                "gpu.sxid", node, subject, f"non-fatal {listing} {period}: {last.message}", details=details,
                remedy="non-fatal NVSwitch errors: watch whether they grow between audits; look the SXid up in the "
                       "Fabric Manager User Guide and check the NVLink path of the named link"))
    if not findings:
        findings.append(Finding.ok("gpu.sxid", node, "nvswitch",
                                   f"{len(earlier)} SXid line(s) before the last boot ({_when(facts.boot_time)}), none since",
                                   details={"before_boot": len(earlier), "boot_time": facts.boot_time}))
    return findings
