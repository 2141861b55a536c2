"""KV handoff time from prefill to decode: bytes / bandwidth + fabric latency.

Bandwidth is in Gb/s (10^9 bits per second, as NICs are rated); latency in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TransferPlan:
    bytes: int
    bandwidth_gbps: float
    links: int
    latency_us: float
    seconds: float
    wire_seconds: float


def plan_transfer(
    nbytes: int, bandwidth_gbps: float, latency_us: float = 0.0, links: int = 1
) -> TransferPlan:
    if nbytes < 0:
        raise ValueError(f"bytes must be >= 0, got {nbytes}")
    if bandwidth_gbps <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_gbps}")
    if latency_us < 0:
        raise ValueError(f"latency must be >= 0, got {latency_us}")
    if links < 1:
        raise ValueError(f"links must be >= 1, got {links}")
    bytes_per_s = bandwidth_gbps * links * 1e9 / 8.0
    wire = nbytes / bytes_per_s
    return TransferPlan(nbytes, bandwidth_gbps, links, latency_us, wire + latency_us * 1e-6, wire)
