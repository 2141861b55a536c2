"""What `audit --remediate` does this run: pure, from the audit's findings and the remediation state the
previous run left in the history.

- A node *should drain* when one of its findings FAILs, belongs to `remediation.checks` and says drain:
  its remedy asks to drain the node or the GPU (the GPU rules' remedies, core/gpu/), or its check is in
  `remediation.always_drain`. A GPU of a tensor-parallel server cannot be drained alone, so "drain the
  GPU" drains the node.
- It is drained unless that would put more than `max_drained` nodes of one of its roles out of service,
  or take the last node of a role out of service (a fleet with no prefill or no decode serves nothing).
  Then it is *held*: reported, retried next run, never drained behind the operator's back.
- A drained node is never drained again (no second hook run, no second count); its router drain is
  re-asserted every run, so a router restart does not quietly put it back.
- It returns after `recovery_audits` consecutive runs that checked it and found nothing that drains. A
  run that could not check it (unreachable, facts not gathered) neither counts nor resets the window.

The state is plain JSON (the history line's `remediation`), so this module can be tested with no router,
no node and no clock but the `now` it is given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from infer_ctl.core.findings import Finding, Status
from infer_ctl.profile.remediation import RemediationSettings

#: the GPU rules' remedies say "drain the node ...", "drain it", "drain the GPU ..."; "drain peer-to-peer
#: traffic" (a warning-level recovery action) is not a drain of the node
_SAYS_DRAIN = re.compile(r"\bdrain(?:ed)?\s+(?:the\s+node|the\s+gpu|it)\b", re.IGNORECASE)
ACTIONS = ("drain", "return", "held", "drain_failed", "return_failed", "hook_failed", "reasserted")


def says_drain(finding: Finding, policy: RemediationSettings) -> bool:
    if finding.status is not Status.FAIL:
        return False
    if not any(fnmatchcase(finding.check, p) for p in policy.checks):
        return False
    if any(fnmatchcase(finding.check, p) for p in policy.always_drain):
        return True
    return finding.details.get("action") == "drain" or bool(finding.remedy and _SAYS_DRAIN.search(finding.remedy))


def drain_reasons(findings: Iterable[Finding], policy: RemediationSettings) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        if says_drain(f, policy):
            out.setdefault(f.node, []).append(f)
    return out


def checked_nodes(findings: Iterable[Finding]) -> set[str]:
    """Nodes this run judged: some finding names them and none says their facts were not gathered."""
    seen: set[str] = set()
    blind: set[str] = set()
    for f in findings:
        seen.add(f.node)
        if f.status is Status.UNKNOWN and f.details.get("not_gathered"):
            blind.add(f.node)
    return seen - blind


def reason_text(reasons: Sequence[Finding] | Sequence[Sequence[str]], limit: int = 160) -> str:
    """One line for the hook's {reason} and the findings: `gpu.xid GPU2: XID 79 ...; gpu.row_remap ...`."""
    parts = []
    for r in reasons:
        check, subject, message = (r.check, r.subject, r.message) if isinstance(r, Finding) else (r[0], r[1], r[2])
        parts.append(f"{check} {subject}: {message}")
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class NodeRoles:
    name: str
    roles: frozenset[str]


@dataclass(frozen=True)
class Drain:
    node: str
    roles: frozenset[str]
    reasons: tuple[Finding, ...]


@dataclass(frozen=True)
class Hold:
    node: str
    reasons: tuple[Finding, ...]
    why: str


@dataclass(frozen=True)
class Keep:
    """A drained node that stays out: still failing (clean 0), not checked, or inside its window."""

    node: str
    clean_audits: int
    needed: int
    checked: bool
    reasons: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class Return:
    node: str
    clean_audits: int


@dataclass
class Plan:
    drain: list[Drain] = field(default_factory=list)
    hold: list[Hold] = field(default_factory=list)
    keep: list[Keep] = field(default_factory=list)
    ret: list[Return] = field(default_factory=list)


def drained_of(state: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    drained = (state or {}).get("drained") or {}
    return {str(k): dict(v) for k, v in drained.items() if isinstance(v, Mapping)}


def plan(state: Mapping[str, Any] | None, findings: Sequence[Finding], fleet: Sequence[NodeRoles],
         policy: RemediationSettings) -> Plan:
    """The steps of this run. `fleet`: every node of the profile (not only the audited ones), so the
    role limits count the nodes out of service that this run did not select."""
    reasons = drain_reasons(findings, policy)
    checked = checked_nodes(findings)
    drained = drained_of(state)
    roles_of = {n.name: n.roles for n in fleet}
    out = Plan()
    returning: set[str] = set()
    for node, rec in drained.items():
        clean = int(rec.get("clean_audits", 0) or 0)
        if node in reasons:
            out.keep.append(Keep(node, 0, policy.recovery_audits, True, tuple(reasons[node])))
        elif node in checked:
            clean += 1
            if clean >= policy.recovery_audits:
                out.ret.append(Return(node, clean))
                returning.add(node)
            else:
                out.keep.append(Keep(node, clean, policy.recovery_audits, True))
        else:
            out.keep.append(Keep(node, clean, policy.recovery_audits, False))
    out_of_service = {n for n in drained if n not in returning}
    order = {n.name: i for i, n in enumerate(fleet)}
    for node in sorted((n for n in reasons if n not in drained), key=lambda n: order.get(n, len(order))):
        roles = roles_of.get(node, frozenset())
        why = _blocked(node, roles, out_of_service, roles_of, policy)
        if why:
            out.hold.append(Hold(node, tuple(reasons[node]), why))
            continue
        out.drain.append(Drain(node, roles, tuple(reasons[node])))
        out_of_service.add(node)
    return out


def _blocked(node: str, roles: frozenset[str], out_of_service: set[str], roles_of: Mapping[str, frozenset[str]],
             policy: RemediationSettings) -> str | None:
    for role in sorted(roles):
        with_role = [n for n, r in roles_of.items() if role in r]
        out = [n for n in with_role if n in out_of_service]
        if len(out) + 1 > policy.max_drained:
            return (f"{len(out)} {role} node(s) already out of service ({', '.join(sorted(out))}); "
                    f"remediation.max_drained is {policy.max_drained}")
        if len(with_role) - len(out) - 1 < 1:
            return f"it is the last {role} node in service"
    return None


def next_state(state: Mapping[str, Any] | None, steps: Plan, *, now: str, drained_ok: Mapping[str, Mapping[str, Any]],
               returned_ok: Iterable[str], counts: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The state after this run's steps were carried out: `drained_ok` (node -> what the drain recorded:
    workers, router state) for the drains that happened, `returned_ok` the returns that happened (a
    failed drain or return leaves the node as it was, to be retried), `counts` this run's actions per
    action and node, added to the running totals (the Prometheus counters)."""
    drained = drained_of(state)
    for k in steps.keep:
        if k.node in drained:
            drained[k.node]["clean_audits"] = k.clean_audits
            if k.reasons:
                drained[k.node]["last_reasons"] = [[f.check, f.subject, f.message] for f in k.reasons]
    returned = set(returned_ok)
    for r in steps.ret:
        if r.node in returned:
            drained.pop(r.node, None)
        elif r.node in drained:
            drained[r.node]["clean_audits"] = r.clean_audits
    for d in steps.drain:
        rec = drained_ok.get(d.node)
        if rec is None:
            continue
        drained[d.node] = {"since": now, "roles": sorted(d.roles), "clean_audits": 0,
                           "reasons": [[f.check, f.subject, f.message] for f in d.reasons], **dict(rec)}
    totals: dict[str, dict[str, int]] = {a: dict(v) for a, v in ((state or {}).get("counters") or {}).items()
                                          if isinstance(v, Mapping)}
    for action, per_node in counts.items():
        for node, n in per_node.items():
            totals.setdefault(action, {})[node] = totals.get(action, {}).get(node, 0) + int(n)
    return {"drained": drained, "counters": totals}


def hook_argv(template: Sequence[str], *, node: str, host: str, reason: str) -> list[str]:
    """The hook's argv: placeholders replaced inside their own element (a reason with spaces or quotes
    stays one argument: there is no shell); the node name appended when no element names it."""
    argv = [a.replace("{node}", node).replace("{host}", host).replace("{reason}", reason) for a in template]
    if not any("{node}" in a for a in template):
        argv.append(node)
    return argv


#: the pair tests whose verdicts the router hears (`check fabric --pingpong`, `audit --pingpong`, `--gdr`)
PAIR_CHECKS = ("fabric.pingpong", "fabric.write_lat", "fabric.write_bw", "fabric.gdr")


def pair_verdicts(findings: Iterable[Finding]) -> dict[tuple[str, str], tuple[str, str | None]]:
    """(server node, client node) -> ("fail" | "ok", why) over every rail and tool of the pair: one FAIL
    fails the pair, a WARN (slow but working) does not; a pair with only UNKNOWN results says nothing."""
    worst_of: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        if f.check in PAIR_CHECKS and "server" in f.details and "client" in f.details:
            worst_of.setdefault((str(f.details["server"]), str(f.details["client"])), []).append(f)
    out: dict[tuple[str, str], tuple[str, str | None]] = {}
    for key, fs in worst_of.items():
        failed = [f for f in fs if f.status is Status.FAIL]
        if failed:
            out[key] = ("fail", f"{failed[0].check}: {failed[0].message}")
        elif any(f.status in (Status.OK, Status.WARN) for f in fs):
            out[key] = ("ok", None)
    return out
