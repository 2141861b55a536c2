"""The remediation state in the audit history and its Prometheus families: what every audit run needs,
also without --remediate (the state is carried on, the counters stay in the textfile). Kept apart from
checks/remediate.py, which talks to the router, so an audit that does not act loads no HTTP client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from infer_ctl.checks.history import records_newest_first
from infer_ctl.core import remediation as rem
from infer_ctl.core.findings import Finding
from infer_ctl.core.promtext import MetricFamily
from infer_ctl.profile import Profile


def last_state(history: str | Path, profile_name: str) -> dict[str, Any] | None:
    """The remediation state of the newest history line of this profile that has one (whatever kind of
    run wrote it: a --pingpong run between two --remediate runs carries it on)."""
    for record in records_newest_first(history, profile_name):
        if isinstance(record.get("remediation"), dict):
            return dict(record["remediation"])
    return None


def audit_step(profile: Profile, findings: Sequence[Finding], history: str | Path | None, *, act: bool,
               now: str) -> tuple[list[Finding], dict[str, Any] | None]:
    """What the audit adds: remediation findings (when acting) and the state its history line carries.
    Without --remediate the previous state is carried unchanged, so the counters and the drained nodes
    survive runs that do not act."""
    previous = last_state(history, profile.name) if history is not None else None
    if not act:
        return [], previous
    from infer_ctl.checks.remediate import remediate  # the router client: only when acting

    out = remediate(profile, findings, previous, now=now)
    return out.findings, out.state


def textfile_families(state: Mapping[str, Any], roles: Mapping[str, Sequence[str]]) -> list[MetricFamily]:
    """The running totals of every action (counters: they only grow, across runs) and which nodes are
    out of service now."""
    actions = MetricFamily("inferctl_remediation_actions_total",
                           "Remediation steps taken by audit --remediate, by action and node", type="counter")
    for action, per_node in sorted((state.get("counters") or {}).items()):
        for node, n in sorted(per_node.items()):
            actions.add(n, action=action, node=node)
    drained = MetricFamily("inferctl_remediation_drained", "1 while audit --remediate keeps the node out of service")
    for node, rec in sorted(rem.drained_of(state).items()):
        drained.add(1, node=node, role=",".join(rec.get("roles") or roles.get(node) or []))
    return [actions, drained]

