"""fabric.link_flaps: RDMA links that went down and came back, from the node's journal, over time.

One line per link state change, in the formats the fixtures show: systemd-networkd's `ib6: lost carrier`
/ `Gained carrier` (Azure/azurehpc-health-checks test/data/1dev_6flap_syslog) and mlx5's `mlx5_5: Port: 1
Link DOWN|INIT|ACTIVE` (leptonai/gpud PR #1209's journal), plus mlx5e's `<netdev>: Link down|up`. The
rule follows aznhc's IB link-flapping check (customTests/azure_ib_link_flapping.nhc, NHC2005): a link
that went down more than once within `fabric.flap_window_h` (6 h there too) is flapping (FAIL); one
down in the window is a warning. What earlier audits saw is remembered (`memory`: the down events in the
window per link), so the rate between runs is reported (`new_since_last_audit`) and a flap an earlier
audit saw still counts after the journal rotated it away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.findings import Finding

FLAP_REMEDY = ("a flapping link: check the cable/transceiver (ethtool -m), the switch port's log and error "
               "counters, and reseat or replace the optics; take the node's servers out of the router if it keeps "
               "flapping (KV transfers on it fail or stall while it is down)")


@dataclass(frozen=True)
class LinkEvent:
    link: str
    #: "down" | "up"
    state: str
    at: float | None
    line: str


@dataclass
class LinkLog:
    events: list[LinkEvent]
    #: the journal could not be read (why), or None
    error: str | None = None
    window_h: float = 6.0
    #: when the node read it (Unix time)
    read_at: float | None = None


def judge_link_flaps(node: str, log: LinkLog, previous: Mapping[str, Any] | None) -> list[Finding]:
    """Per link with down events in the window: WARN one, FAIL more than one; an OK line otherwise.
    `previous`: the memory of this node's fabric.link_flaps findings (subject -> {"downs": [...]})."""
    if log.error is not None:
        return [Finding.skip("fabric.link_flaps", node, "node", f"link flaps not checked: {log.error}",
                             remedy="add the SSH user to the systemd-journal (or adm) group to read the journal")]
    start = (log.read_at or 0.0) - log.window_h * 3600
    downs: dict[str, set[float]] = {}
    lines: dict[str, list[str]] = {}
    for e in log.events:
        if e.state == "down" and e.at is not None and e.at >= start:
            downs.setdefault(e.link, set()).add(round(e.at, 3))
            lines.setdefault(e.link, []).append(e.line)
    for link, mem in (previous or {}).items():
        if isinstance(mem, Mapping):  # an earlier audit's events, maybe rotated out of the journal since
            downs.setdefault(link, set()).update(float(t) for t in mem.get("downs") or [] if float(t) >= start)
    out = []
    for link in sorted(downs):
        seen = sorted(downs[link])
        before = {float(t) for t in ((previous or {}).get(link) or {}).get("downs") or []} \
            if isinstance((previous or {}).get(link), Mapping) else set()
        new = [t for t in seen if t not in before]
        details = {"downs_in_window": len(seen), "new_since_last_audit": len(new), "window_h": log.window_h,
                   "last_down": seen[-1], "lines": lines.get(link, [])[-5:], "memory": {"downs": seen}}
        text = f"went down {len(seen)}x in the last {log.window_h:g} h ({len(new)} since the last audit)"
        if len(seen) > 1:
            out.append(Finding.fail("fabric.link_flaps", node, link, f"{link} is flapping: {text}", details=details,
                                    remedy=FLAP_REMEDY))
        else:
            out.append(Finding.warn("fabric.link_flaps", node, link, f"{link} {text}", details=details,
                                    remedy=FLAP_REMEDY))
    if not out:
        out.append(Finding.ok("fabric.link_flaps", node, "node", f"no link went down in the last {log.window_h:g} h",
                              details={"events": len(log.events)}))
    return out

