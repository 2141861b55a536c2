"""`inferctl audit`: every registered check family over one fleet (one SSH connection per node),
aggregated to one status, plus the cron outputs: a node_exporter textfile, a JSON-lines history, and
the changes since the previous run.

History line (one per run, appended):
    {"ts": "2025-01-01T00:00:00Z", "profile": "prod-a", "status": "fail", "exit_code": 2,
     "duration_s": 3.2, "families": ["gpu"], "nodes": ["pf-01", ...],
     "findings": [["gpu.xid", "pf-01", "GPU3", "fail", "XID 79 ..."], ...],
     "not_checked": [["gpu.row_remap", "pf-02", "GPU1", "fail", "row remap pending"], ...],
     "memory": {"gpu.pcie_replay": {"pf-01": {"GPU0": {...}}}, ...}}

`not_checked` carries the last known state of problems whose facts this run could not gather (node
unreachable, a fact UNKNOWN): they are neither current findings nor recovered, and the next run compares
against them. `memory` holds what rules asked to keep between runs (a finding's `details["memory"]`:
counters for rates, XIDs of earlier boots); a family reads the previous run's as `ctx.options["memory"]`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer_ctl.atomicfile import append_line
from infer_ctl.checks.history import records_newest_first
from infer_ctl.checks.registry import AuditContext, CheckFamily
from infer_ctl.core.findings import Finding, Status, overall_status, worst
from infer_ctl.core.promtext import STATUS_CODES, MetricFamily, findings_families, render
from infer_ctl.core.report import Report
from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.output.textfile import write_textfile
from infer_ctl.profile import Node, Profile

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

Key = tuple[str, str, str]  # (check, node, subject)
_RANK = {Status.OK: 0, Status.SKIP: 0, Status.WARN: 1, Status.UNKNOWN: 2, Status.FAIL: 3}
#: statuses that say something is wrong (an UNKNOWN says only that it could not be told)
_KNOWN_PROBLEM = (Status.WARN, Status.FAIL)


@dataclass
class AuditResult:
    findings: list[Finding]
    families: list[str]
    nodes: list[str]
    family_durations: dict[str, float] = field(default_factory=dict)
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    duration_s: float = 0.0

    @property
    def status(self) -> Status:
        return overall_status(self.findings)


def run_families(
    profile: Profile, fleet: Fleet, nodes: list[Node], families: Sequence[CheckFamily], options: dict[str, Any]
) -> AuditResult:
    started = time.monotonic()
    result = AuditResult(findings=[], families=[f.name for f in families], nodes=[n.name for n in nodes])
    ctx = AuditContext(profile=profile, fleet=fleet, nodes=nodes, options=options)
    for family in families:
        t0 = time.monotonic()
        try:
            result.findings.extend(family.run(ctx))
        except KeyboardInterrupt:
            raise
        except InferctlError as exc:
            result.findings.append(
                Finding.unknown(f"{family.name}.internal", "controller", family.name,
                                f"{family.name} checks did not run: {exc.message}", remedy=exc.remedy)
            )
        except Exception as exc:  # one broken family must not hide the others' findings
            result.findings.append(
                Finding.unknown(
                    f"{family.name}.internal", "controller", family.name,
                    f"{family.name} checks crashed: {type(exc).__name__}: {exc}",
                    remedy=f"rerun `inferctl check {family.name} --debug` and report the traceback",
                )
            )
        result.family_durations[family.name] = time.monotonic() - t0
    result.duration_s = time.monotonic() - started
    return result


# ---- textfile --------------------------------------------------------------------------------------
def textfile_text(result: AuditResult, *, run_timestamp: float, extra: Sequence[MetricFamily] = ()) -> str:
    """`extra`: families other parts of the run add (audit --remediate's counters)."""
    families = findings_families(result.findings, run_timestamp=run_timestamp, duration_s=result.duration_s)
    overall = MetricFamily("inferctl_audit_status", "Overall audit status: 0 ok, 1 warn, 2 fail, 3 unknown")
    overall.add(STATUS_CODES[result.status])
    per_family = MetricFamily("inferctl_audit_family_duration_seconds", "Duration of each check family")
    for name, seconds in result.family_durations.items():
        per_family.add(seconds, family=name)
    per_node = MetricFamily("inferctl_node_status", "Worst status per node: 0 ok, 1 warn, 2 fail, 3 unknown")
    by_node: dict[str, list[Status]] = {}
    for f in result.findings:
        by_node.setdefault(f.node, []).append(f.status)
    for node, statuses in sorted(by_node.items()):
        per_node.add(STATUS_CODES[worst(statuses)], node=node)
    return render([*families, overall, per_family, per_node, *extra])


def write_audit_textfile(path: str | os.PathLike[str], result: AuditResult, *, run_timestamp: float,
                         extra: Sequence[MetricFamily] = ()) -> Path:
    return write_textfile(path, textfile_text(result, run_timestamp=run_timestamp, extra=extra))


# ---- history ---------------------------------------------------------------------------------------
def history_record(
    result: AuditResult,
    profile_name: str,
    *,
    pingpong: bool = False,
    not_checked: Sequence[Sequence[str]] = (),
    memory: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "ts": result.started_at.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "profile": profile_name,
        "status": result.status.value,
        "exit_code": int(result.status.exit_code),
        "duration_s": round(result.duration_s, 3),
        "families": result.families,
        "nodes": result.nodes,
        # runs with and without the fabric pair tests are different kinds of run (see read_last_run)
        "pingpong": pingpong,
        "findings": [[f.check, f.node, f.subject, f.status.value, f.message] for f in result.findings],
        "not_checked": [list(row) for row in not_checked],
        "memory": memory if memory is not None else remembered(result.findings),
    }


# ---- what rules keep between runs ---------------------------------------------------------------------
def remembered(findings: Sequence[Finding], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """{check: {node: {subject: value}}} of every finding's `details["memory"]`, on top of the previous
    run's memory: a node this run did not reach keeps what the last run that reached it remembered."""
    memory: dict[str, Any] = {check: {node: dict(subjects) for node, subjects in nodes.items()}
                              for check, nodes in ((previous or {}).get("memory") or {}).items()
                              if isinstance(nodes, dict)}
    for f in findings:
        value = f.details.get("memory")
        if value is not None:
            memory.setdefault(f.check, {}).setdefault(f.node, {})[f.subject] = _plain(value)
    return memory


def _plain(value: Any) -> Any:
    """A frozen details value (read-only mappings, tuples) as plain JSON-able data."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def append_history(path: str | os.PathLike[str], record: dict[str, Any]) -> None:
    """One line per run (atomicfile.append_line: a torn last line gets its newline first, a short
    write is finished or raises); a torn line is skipped by the readers (checks/history.py)."""
    append_line(path, json.dumps(record, separators=(",", ":")))


def read_last_run(
    path: str | os.PathLike[str], profile_name: str | None = None, *, pingpong: bool | None = None
) -> dict[str, Any] | None:
    """The newest complete record (of this profile, and with/without pair tests, when given); None when
    there is none yet. Matching `pingpong` keeps an hourly `--pingpong` run and the 10-minute runs
    without it from reporting each other's pair-test findings as new or recovered."""
    for record in records_newest_first(path, profile_name):
        if record.get("kind", "audit") != "audit":  # another line kind, e.g. a spec controller action
            continue
        if pingpong is None or bool(record.get("pingpong", False)) == pingpong:
            return record
    return None


# ---- changes since the last run ---------------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    kind: str  # new | worse | better | recovered | not_checked
    check: str
    node: str
    subject: str
    before: str | None
    after: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"change": self.kind, "check": self.check, "node": self.node, "subject": self.subject,
                "from": self.before, "to": self.after, "message": self.message}


Scope = tuple[tuple[str, ...], str, str, str]  # (check patterns, node pattern, subject pattern, why)


def unchecked_scopes(findings: Sequence[Finding]) -> list[Scope]:
    """Where this run could not see: checks (fnmatch patterns, `!pattern` excludes) per node whose facts
    were not gathered. A finding says so with `details["not_gathered"]` (e.g. gpu.facts of an unreachable
    node: `["gpu.*"]`); any UNKNOWN finding covers its own check id on its node (the kernel log was not
    readable: earlier gpu.xid findings of that node were not checked); a family that did not run
    (`<family>.internal` on the controller) covers the whole family on every node. Findings keyed on
    another node can be covered too, by subject: `details["not_gathered_subjects"]` = [[check pattern,
    subject pattern], ...] on any node (a pair test is keyed on its server; when the client could not take
    part, `["fabric.pingpong", "*<client>/*"]` covers it)."""
    scopes: list[Scope] = []
    for f in findings:
        why = f.message
        patterns = f.details.get("not_gathered")
        if patterns:
            scopes.append((tuple(patterns), f.node, "*", why))
        for check_pattern, subject_pattern in f.details.get("not_gathered_subjects") or ():
            scopes.append(((check_pattern,), "*", subject_pattern, why))
        if f.status is Status.UNKNOWN:
            family, _, rest = f.check.partition(".")
            if rest == "internal" and f.node == "controller":
                scopes.append(((f"{family}.*",), "*", "*", why))
            else:
                scopes.append(((f.check,), f.node, "*", why))
    return scopes


def _not_checked_because(scopes: Sequence[Scope], check: str, node: str, subject: str) -> str | None:
    for patterns, node_pattern, subject_pattern, why in scopes:
        if node_pattern not in ("*", node) or not fnmatchcase(subject, subject_pattern):
            continue
        hits = [p for p in patterns if not p.startswith("!") and fnmatchcase(check, p)]
        if hits and not any(fnmatchcase(check, p[1:]) for p in patterns if p.startswith("!")):
            return why
    return None


def _previous_problems(previous: dict[str, Any] | None) -> dict[Key, tuple[Status, str, bool]]:
    """(status, message, carried) of every problem of the previous run, including the ones it carried
    as not checked (their last known state)."""
    out: dict[Key, tuple[Status, str, bool]] = {}
    for rows, carried in (((previous or {}).get("not_checked") or [], True), ((previous or {}).get("findings") or [], False)):
        for check, node, subject, status, message in rows:
            out[(check, node, subject)] = (Status(status), message, carried)
    return out


def carry_unchecked(previous: dict[str, Any] | None, result: AuditResult) -> list[list[str]]:
    """The previous run's problems (its findings and what it carried) that this run did not check: the
    rows of the new record's `not_checked`."""
    scopes = unchecked_scopes(result.findings)
    now = {(f.check, f.node, f.subject): f for f in result.findings}
    rows = []
    for key, (status, message, _) in _previous_problems(previous).items():
        current = now.get(key)
        if status not in _KNOWN_PROBLEM or (current is not None and current.status is not Status.UNKNOWN):
            continue
        if _not_checked_because(scopes, *key) is not None:
            rows.append([*key, status.value, message])
    return rows


def diff_runs(previous: dict[str, Any] | None, result: AuditResult) -> tuple[list[Change], list[Finding]]:
    """Changes against the previous run, and the findings to report for them (the current finding for
    new/worse/better problems, an OK 'recovered' finding for problems that went away). Only keys of
    nodes and families checked in both runs are compared, so `--nodes` subsets do not fake recoveries;
    findings of pseudo-nodes outside the fleet ("controller", "fleet", "local") follow their family.

    A problem whose facts this run could not gather (unchecked_scopes: the node unreachable, the fact
    UNKNOWN) is `not_checked`, never `recovered`: an alert pipeline must not resolve an RMA alert because
    the node died. It is reported once, when it stops being checked (an UNKNOWN finding "not checked");
    the history carries its last known state until the node is checked again."""
    problems = _previous_problems(previous)
    before: dict[Key, tuple[Status, str]] = {k: (v[0], v[1]) for k, v in problems.items()}
    scopes = unchecked_scopes(result.findings)
    prev_nodes = set((previous or {}).get("nodes", []))
    prev_families = set((previous or {}).get("families", []))
    now = {(f.check, f.node, f.subject): f for f in result.findings}
    changes: list[Change] = []
    report: list[Finding] = []
    for key, finding in now.items():
        old = before.get(key)
        rank = _RANK[finding.status]
        if old is None:
            if rank > 0:
                changes.append(Change("new", *key, None, finding.status.value, finding.message))
                report.append(finding)
            continue
        old_rank = _RANK[old[0]]
        if old[0] in _KNOWN_PROBLEM and finding.status is Status.UNKNOWN and _not_checked_because(scopes, *key):
            if not problems[key][2]:  # reported when it stopped being checked, not on every run since
                changes.append(Change("not_checked", *key, old[0].value, finding.status.value, finding.message))
                report.append(_not_checked(key, old, finding.message))
            continue
        if rank != old_rank:
            kind = "worse" if rank > old_rank else ("recovered" if rank == 0 else "better")
            changes.append(Change(kind, *key, old[0].value, finding.status.value, finding.message))
            report.append(finding)
    now_nodes = set(result.nodes)
    fleet_nodes = now_nodes | prev_nodes
    families = set(result.families)
    for key, (status, message) in before.items():
        check, node, subject = key
        family = check.split(".", 1)[0]
        if key in now or _RANK[status] == 0:
            continue
        # a fleet node must have been checked in both runs; a pseudo-node that is in neither run's node
        # list (the controller side, e.g. "local" of the tokenizer family) only needs its family
        if node in fleet_nodes and not (node in now_nodes and node in prev_nodes):
            continue
        if family not in families or family not in prev_families:
            continue
        why = _not_checked_because(scopes, check, node, subject) if status in _KNOWN_PROBLEM else None
        if why is not None:
            if not problems[key][2]:
                changes.append(Change("not_checked", *key, status.value, None, f"not checked: {why}"))
                report.append(_not_checked(key, (status, message), why))
            continue
        changes.append(Change("recovered", *key, status.value, None, f"no longer reported (was: {message})"))
        report.append(Finding.ok(check, node, subject, f"recovered: no longer reported (was {status.value}: {message})"))
    return changes, report


def _not_checked(key: Key, old: tuple[Status, str], why: str) -> Finding:
    check, node, subject = key
    return Finding.unknown(check, node, subject, f"not checked: {why} (last known {old[0].value}: {old[1]})",
                           details={"last_status": old[0].value, "last_message": old[1], "not_checked": True},
                           remedy="the last known problem stands until the node is checked again: make it "
                                  "reachable (inferctl nodes), then rerun the audit")


# ---- one audit run, as the CLI does it -----------------------------------------------------------------
def _check_output_path(flag: str, path: Path) -> None:
    """A usage error (64) when `path` cannot be a file we write: a directory, or a parent we cannot create."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory", remedy=f"name a file, e.g. {path / 'inferctl.prom'}"
                         if flag == "--textfile" else f"name a file, e.g. {path / 'audit.jsonl'}")
    try:  # the write would create the directory anyway; doing it now finds an impossible path early
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot create its directory: {exc.strerror or exc}",
                         remedy="choose a path the user running the audit can write") from None
    if not os.access(path.parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{flag} {path}: not writable",
                         remedy="choose a path the user running the audit can write, or fix its permissions")

@dataclass
class AuditOptions:
    only: set[str] | None = None
    textfile: Path | None = None
    history: Path | None = None
    since_last: bool = False
    accept_new_host_keys: bool = False
    parallel: int | None = None
    #: the fabric family runs its pair tests (ibv_rc_pingpong/perftest) only when asked: they take time
    pingpong: bool = False
    #: take nodes whose findings say "drain" out of service (profile `remediation:`; checks/remediate.py)
    remediate: bool = False

    def family_options(self, previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """What families see as `ctx.options` (they ignore keys they do not know): `memory` is what the
        previous run's rules kept (see `remembered`)."""
        return {"pingpong": self.pingpong, "memory": (previous or {}).get("memory") or {},
                "history": self.history}


def audit(profile: Profile, nodes: list[Node], families: Sequence[CheckFamily], opts: AuditOptions) -> Report:
    """Run the audit and write its outputs; returns the --json document. The exit code always reflects
    the whole run (also with --since-last, where `findings` holds only the changes)."""
    from infer_ctl.remote.fleet import Fleet  # imported here: registry/audit tests need no SSH stack

    if opts.remediate and (opts.history is None or not profile.remediation.enabled):
        raise UsageError("--remediate needs --history PATH (drained nodes and recovery windows are kept there)"
                         if opts.history is None else "--remediate: remediation.enabled is false in the profile",
                         remedy="e.g. inferctl audit --remediate --history /var/lib/inferctl/audit.jsonl"
                         if opts.history is None else "add `remediation: {enabled: true}` to the profile "
                         "(docs/runbooks/cron-audit.md, Remediation)")
    if opts.since_last and opts.history is None:
        raise InferctlError("--since-last needs --history PATH (the previous runs are read from it)",
                            remedy="e.g. inferctl audit --history /var/lib/inferctl/audit.jsonl --since-last",
                            exit_code=64)
    # checked before the (possibly long) run, so a typo in a cron line fails fast instead of after it
    for flag, path in (("--textfile", opts.textfile), ("--history", opts.history)):
        if path is not None:
            _check_output_path(flag, path)
    try:
        previous = read_last_run(opts.history, profile.name, pingpong=opts.pingpong) if opts.history else None
    except OSError as exc:
        raise UsageError(f"--history {opts.history}: cannot read it: {exc.strerror or exc}",
                         remedy="point --history at a readable JSON-lines file (it is created if missing)") from None
    with Fleet(profile, accept_new_host_keys=opts.accept_new_host_keys, parallel=opts.parallel) as fleet:
        result = run_families(profile, fleet, nodes, families, opts.family_options(previous))
    from infer_ctl.checks.remediation_state import audit_step, textfile_families

    acted, remediation = audit_step(profile, result.findings, opts.history, act=opts.remediate,
                                    now=result.started_at.isoformat(timespec="seconds").replace("+00:00", "Z"))
    result.findings.extend(acted)
    finished = time.time()
    record: dict[str, Any] | None = None
    if opts.history:  # thousands of findings on a large fleet: built only when it is written
        record = history_record(result, profile.name, pingpong=opts.pingpong,
                                not_checked=carry_unchecked(previous, result),
                                memory=remembered(result.findings, previous))
        if remediation is not None:
            record["remediation"] = remediation
    extra = textfile_families(remediation, {n.name: [r.value for r in n.roles] for n in profile.nodes}) \
        if remediation is not None else []
    try:
        if opts.textfile:
            write_audit_textfile(opts.textfile, result, run_timestamp=finished, extra=extra)
        if opts.history and record is not None:
            append_history(opts.history, record)
    except OSError as exc:  # disk full, permissions changed during the run, ...
        raise InferctlError(f"the audit ran ({result.status.value}) but its output could not be written: {exc}",
                            remedy="free space or fix permissions for --textfile/--history, then rerun") from None
    report = Report("audit", profile.name, started_at=result.started_at, findings=result.findings,
                    exit_code_override=result.status.exit_code,
                    data={"families": result.families, "nodes": result.nodes,
                          "family_durations_s": {k: round(v, 3) for k, v in result.family_durations.items()}})
    if opts.since_last:
        # the run's own counts stay: its status (the exit code) is the whole run's, not the changes'
        report.data["run_counts"] = {s.value: n for s in Status
                                     if (n := sum(1 for f in result.findings if f.status is s))}
        changes, changed = diff_runs(previous, result)
        report.findings = changed
        report.data["since"] = previous.get("ts") if previous else None
        report.data["changes"] = [c.to_dict() for c in changes]
    return report
