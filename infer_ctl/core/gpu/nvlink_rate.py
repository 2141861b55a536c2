"""gpu.nvlink_rate: NVLink error counters that grew between two audits.

The replay, recovery and CRC counters of `nvidia-smi nvlink -e` only grow until the next boot or GPU
reset, so gpu.nvlink can only say they are not zero; the growth between audits is what DCGM's NVLink
health watch judges (modules/health/DcgmHealthWatch.cpp MonitorNVLink4Fields, DCGM 4.6.0, commit
72fa3fea; limits in common/DcgmGPUHardwareLimits.h): any replay or recovery error over its window is a
failure ("replay and recovery errors are failures, not warnings"), CRC errors fail at 100 per second
(DCGM_LIMIT_MAX_NVLINK_CRC_ERROR) and warn below that. Here the window is the time between the two
audits (DCGM's is a minute, so a rate per second is comparable; a count is stricter over a longer one).
A counter that went down, or another boot, starts again without a verdict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.facts import GpuFacts, NodeGpuFacts

CRC_FAIL_PER_S = 100.0
MIN_INTERVAL_S = 30.0
SAME_BOOT_S = 60.0
KINDS = ("replay", "recovery", "crc")


def _counters(gpu: GpuFacts) -> dict[str, list[int | None]]:
    return {str(link.link): [link.replay_errors, link.recovery_errors, link.crc_errors] for link in gpu.nvlinks or ()}


def judge_nvlink_rate(node: str, gpu: GpuFacts, facts: NodeGpuFacts, previous: Mapping[str, Any] | None) -> Finding | None:
    counters = _counters(gpu)
    if not counters or all(v is None for vals in counters.values() for v in vals):
        return None  # no error counters read (nvlink -e unsupported, no NVLink)
    memory = {"links": counters, "at": facts.gathered_at, "boot_time": facts.boot_time}
    details: dict[str, Any] = {"memory": memory}
    interval = _interval(facts, previous)
    if interval is None:
        return Finding.ok("gpu.nvlink_rate", node, gpu.subject,
                          "NVLink error counters recorded (the growth needs an earlier audit of this boot in --history)",
                          details=details)
    assert previous is not None
    grown: dict[str, dict[str, int]] = {}
    before = previous.get("links") or {}
    for link, vals in counters.items():
        old = before.get(link) if isinstance(before, Mapping) else None
        if not isinstance(old, list | tuple) or len(old) != len(KINDS):
            continue
        for kind, now_v, old_v in zip(KINDS, vals, old, strict=True):
            if isinstance(now_v, int) and isinstance(old_v, int):
                if now_v < old_v:  # reset (GPU reset, driver reload): no verdict for this counter
                    continue
                if now_v > old_v:
                    grown.setdefault(kind, {})[link] = now_v - old_v
    totals = {k: sum(v.values()) for k, v in grown.items()}
    details.update({"interval_s": round(interval, 1), "grown": grown, "totals": totals})
    minutes = interval / 60
    if not grown:
        return Finding.ok("gpu.nvlink_rate", node, gpu.subject, f"no NVLink error counter grew in {minutes:.0f} min",
                          details=details)
    crc_per_s = totals.get("crc", 0) / interval
    details["crc_per_s"] = round(crc_per_s, 3)
    text = ", ".join(f"{kind} +{totals[kind]} (links {', '.join(sorted(grown[kind], key=int))})" for kind in KINDS
                     if kind in grown)
    msg = f"NVLink errors grew in {minutes:.0f} min: {text}"
    if "replay" in grown or "recovery" in grown or crc_per_s >= CRC_FAIL_PER_S:
        return Finding.fail("gpu.nvlink_rate", node, gpu.subject, msg, details=details,
                            remedy="DCGM fails a GPU whose NVLink replays or recovers: drain the node, reset the GPUs "
                                   "(or reboot) and check the NVLink path (baseboard, NVSwitch, fabric manager); "
                                   "open an RMA with the serial number if the counters keep growing after the reset")
    return Finding.warn("gpu.nvlink_rate", node, gpu.subject, msg, details=details,
                        remedy=f"CRC errors below DCGM's {CRC_FAIL_PER_S:g}/s failure rate: watch the trend; reset the "
                               "GPU when drained if it keeps growing")


def _interval(facts: NodeGpuFacts, previous: Mapping[str, Any] | None) -> float | None:
    if not previous or facts.gathered_at is None:
        return None
    at, boot = previous.get("at"), previous.get("boot_time")
    if not isinstance(at, int | float):
        return None
    if boot is not None and facts.boot_time is not None and abs(float(boot) - facts.boot_time) >= SAME_BOOT_S:
        return None  # rebooted: the counters started again
    elapsed = facts.gathered_at - float(at)
    return elapsed if elapsed >= MIN_INTERVAL_S else None
