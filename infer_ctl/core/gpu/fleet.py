"""Consistency across the fleet: driver/CUDA versions and each GPU model's VBIOS.

Mixed versions break NCCL/NIXL between nodes and make bugs node-specific. The fleet's version is the one
most nodes run; when two or more versions tie for the most nodes (a 1:1 split of two nodes, 2:2, ...)
there is no majority to measure against, and blaming one side would be a coin toss: the split itself is
reported once, on the `fleet` pseudo-node, naming every side.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from infer_ctl.core.findings import Finding, Status

#: (status, node, subject, message, details, remedy) of one consistency verdict
Verdict = tuple[Status, str, str, str, dict[str, Any], str | None]


def _consistency(
    subject: str, values: Mapping[str, Hashable], show: Callable[[Any], str], remedy: str
) -> list[Verdict]:
    if len(values) < 2:
        return []
    counts = Counter(values.values())
    top = max(counts.values())
    leaders = [v for v, n in counts.items() if n == top]
    groups = {v: sorted(n for n, x in values.items() if x == v) for v in counts}
    if len(leaders) > 1:
        listing = "; ".join(f"{show(v)} on {', '.join(nodes)}" for v, nodes in sorted(groups.items(), key=lambda kv: str(kv[0])))
        return [(Status.WARN, "fleet", subject, f"{subject}: the fleet is split with no majority: {listing}",
                 {"groups": {show(v): nodes for v, nodes in groups.items()}},
                 f"{remedy} (no version runs on most nodes, so pick the one the profile should pin)")]
    majority = leaders[0]
    out: list[Verdict] = []
    for node, value in sorted(values.items()):
        details = {"value": show(value), "fleet_majority": show(majority), "nodes_with_majority": top,
                   "nodes": len(values)}
        if value == majority:
            out.append((Status.OK, node, subject, f"{show(value)} like the fleet", details, None))
        else:
            out.append((Status.WARN, node, subject,
                        f"{show(value)} differs from the fleet's {show(majority)} ({top} of {len(values)} nodes)",
                        details, remedy))
    return out


def judge_driver_consistency(versions: Mapping[str, tuple[str | None, str | None]]) -> list[Finding]:
    """`versions` maps node -> (driver, cuda) for nodes whose facts were read."""
    known = {n: v for n, v in versions.items() if v[0]}
    verdicts = _consistency("node", known, lambda v: f"driver {v[0]} (CUDA {v[1]})",
                            "pin one driver version in `gpu.driver_version` and provision every node to it")
    # per node the subject stays "node" (as before); the fleet-wide split is about the driver
    return [Finding.make(st, "gpu.driver_consistency", node, "driver" if node == "fleet" else subject, msg,
                         details=details, remedy=remedy) for st, node, subject, msg, details, remedy in verdicts]


def judge_vbios_consistency(by_node: Mapping[str, Mapping[str, str]]) -> list[Finding]:
    """`by_node`: node -> {GPU model: VBIOS} (nodes whose GPUs of a model agree, core.gpu.board.node_vbios)."""
    models = sorted({m for v in by_node.values() for m in v})
    out: list[Finding] = []
    for model in models:
        values = {n: v[model] for n, v in by_node.items() if model in v}
        verdicts = _consistency(model, values, lambda v: f"VBIOS {v}",
                                "update the GPU firmware so every node's GPUs of this model run one VBIOS (the "
                                "vendor's firmware bundle), then reboot")
        out += [Finding.make(st, "gpu.vbios_consistency", node, subject, msg, details=details, remedy=remedy)
                for st, node, subject, msg, details, remedy in verdicts]
    return out
