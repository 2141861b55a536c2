"""gpu.pcie_replay: the PCIe replay rate of a GPU between two audits.

The replay counter only grows (until the next boot), so a single reading says nothing; the rate between
two audits does. DCGM's PCIe health watch (modules/health/DcgmHealthWatch.cpp, MonitorPcie and
GetExpectedPcieReplayRate, DCGM commit 72fa3fea) warns when the replays per minute exceed
ceil(lanes x per-lane rate), the per-lane rate being a bit error rate of 1e-12 at the generation's
signalling rate: 0.15/min at Gen1, 0.3 Gen2, 0.48 Gen3, 0.96 Gen4, 1.92 Gen5, 3.84 Gen6 (Gen5 x16: 31/min).
DCGM takes the current generation over one minute; between audits minutes apart the link changes
generation with load, so the GPU's maximum generation (the larger, more lenient limit) is used here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.facts import GpuFacts, NodeGpuFacts

#: replays per minute per lane at a 1e-12 bit error rate, Gen1..Gen6 (DCGM pcieGenReplayRatePerLane)
PER_LANE_PER_MIN = (2.5 * 60 / 1000, 5.0 * 60 / 1000, 8.0 * 60 / 1000, 16.0 * 60 / 1000, 32.0 * 60 / 1000,
                    64.0 * 60 / 1000)
#: two samples closer than this give no rate worth judging
MIN_INTERVAL_S = 30.0
SAME_BOOT_S = 60.0


def expected_rate(gen: int | None, lanes: int | None) -> int | None:
    """DCGM's limit in replays per minute; None when the link is not known."""
    if not gen or not lanes:
        return None
    return math.ceil(PER_LANE_PER_MIN[min(gen, len(PER_LANE_PER_MIN)) - 1] * lanes)


def judge_pcie_replay(node: str, gpu: GpuFacts, facts: NodeGpuFacts, previous: Mapping[str, Any] | None) -> Finding | None:
    count = gpu.pcie_replays
    if count is None:
        return None
    memory = {"replays": count, "at": facts.gathered_at, "boot_time": facts.boot_time}
    gen = gpu.pcie_gen_max or gpu.pcie_gen_current
    lanes = gpu.pcie_width_current or gpu.pcie_width_max
    limit = expected_rate(gen, lanes)
    details: dict[str, Any] = {"replays": count, "limit_per_min": limit, "gen": gen, "lanes": lanes, "memory": memory}
    rate = _rate(count, facts, previous)
    if rate is None:
        return Finding.ok("gpu.pcie_replay", node, gpu.subject,
                          f"{count} PCIe replays since boot (the rate needs an earlier audit of this boot in --history)",
                          details=details)
    per_min, minutes = rate
    details.update({"per_min": round(per_min, 2), "interval_min": round(minutes, 1)})
    shown = f"{per_min:.1f} PCIe replays/min over {minutes:.0f} min"
    if limit is not None and per_min > limit:
        return Finding.warn(
            "gpu.pcie_replay", node, gpu.subject, f"{shown}, above {limit}/min for Gen{gen} x{lanes}", details=details,
            remedy="the link is retransmitting: reseat the GPU (and its riser/retimer cable), check the slot; a rising "
            "replay rate often comes before a link that trains narrower or an XID 79",
        )
    return Finding.ok("gpu.pcie_replay", node, gpu.subject,
                      f"{shown}" + (f" (limit {limit}/min)" if limit is not None else ""), details=details)


def _rate(count: int, facts: NodeGpuFacts, previous: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """(replays per minute, minutes) since the previous audit's sample of the same boot."""
    if not previous or facts.gathered_at is None:
        return None
    before, at, boot = previous.get("replays"), previous.get("at"), previous.get("boot_time")
    if not isinstance(before, int) or not isinstance(at, int | float):
        return None
    if boot is not None and facts.boot_time is not None and abs(float(boot) - facts.boot_time) >= SAME_BOOT_S:
        return None  # rebooted: the counter started again
    elapsed = facts.gathered_at - float(at)
    if elapsed < MIN_INTERVAL_S or count < before:
        return None
    minutes = elapsed / 60
    return (count - before) / minutes, minutes
