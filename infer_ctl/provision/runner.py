"""Plan and apply over a fleet: steps in order per node, nodes in parallel (bounded by the Fleet),
`rolling` nodes at a time for apply, a failing node stops itself and not the fleet unless fail_fast.

Apply executes exactly the plan that was shown (and confirmed), then probes every step again: a node
whose re-probe still shows a CHANGE fails, so "applied" always means "verified".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infer_ctl.core.provision.lock import lock_entries
from infer_ctl.core.provision.model import EntryKind, NodePlan, PlanEntry
from infer_ctl.errors import InferctlError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.profile import Profile
from infer_ctl.profile.nodes import Node
from infer_ctl.provision.context import Planned, ProvisionOptions, StepContext
from infer_ctl.provision.errors import WheelhouseError
from infer_ctl.provision.selfwheel import node_wheels
from infer_ctl.provision.steps.base import Step
from infer_ctl.provision.steps.registry import all_steps
from infer_ctl.provision.wheelhouse import load_wheelhouse
from infer_ctl.remote.base import Command, Connector
from infer_ctl.remote.errors import NodeSkippedError, SudoError, UnreachableError
from infer_ctl.remote.fleet import Fleet, NodeOutcome


@dataclass
class FleetPlan:
    """Per node: the shown plan (entries) and the actions behind its CHANGE entries."""

    plans: list[NodePlan]
    actions: dict[str, list[Planned]] = field(default_factory=dict)

    @property
    def changes(self) -> int:
        return sum(1 for p in self.plans for e in p.entries if e.kind is EntryKind.CHANGE)


def shared_inputs(profile: Profile, options: ProvisionOptions) -> dict[str, object]:
    """Things computed once for all nodes: the verified local wheelhouse (or why it was refused), and
    the wheels of inferctl itself that the `inferctl` step installs."""
    shared: dict[str, object] = {}
    if options.runs("inferctl"):
        shared["node_wheels"] = node_wheels()
    if profile.sglang.lock_file:
        shared["lock"] = read_lock_file(profile)
    source = options.wheelhouse
    if source is None and profile.sglang.wheelhouse:
        source = Path(profile.sglang.wheelhouse).expanduser()
        if not source.is_absolute():
            source = profile.base_dir / source
    if source is None:
        return shared
    try:
        shared["wheelhouse"] = load_wheelhouse(source)
    except WheelhouseError as exc:
        shared["wheelhouse"] = exc
    return shared


def read_lock_file(profile: Profile) -> str | WheelhouseError:
    """The text of `sglang.lock_file` (relative to the profile's directory), or why it is refused."""
    path = Path(profile.sglang.lock_file or "").expanduser()
    if not path.is_absolute():
        path = profile.base_dir / path
    try:
        text = path.read_text()
    except OSError as exc:
        return WheelhouseError(f"sglang.lock_file {path}: {exc.strerror or exc}",
                               remedy="make it with `inferctl provision lock --out FILE`")  # fmt: skip
    if not lock_entries(text) or any(not hashes for _, hashes in lock_entries(text).values()):
        return WheelhouseError(f"sglang.lock_file {path}: not a lock (every line `name==version --hash=sha256:...`)",
                               remedy="make it with `inferctl provision lock --out FILE`")  # fmt: skip
    return text


def preflight(conn: Connector) -> tuple[bool, str | None]:
    """Is root available? `id -u` through sudo (when ssh.sudo is on) must print 0."""
    try:
        result = conn.run(Command("id", "-u"), sudo=True, timeout=30)
    except SudoError as exc:
        return False, f"{exc.message} ({exc.remedy})" if exc.remedy else exc.message
    if result.ok and result.out.strip() == "0":
        return True, None
    return False, (
        f"{conn.node_name}: the SSH user is not root and ssh.sudo is false; set ssh.sudo: true "
        "(with passwordless sudo) or connect as root"
    )


def plan_node(
    conn: Connector,
    node: Node,
    profile: Profile,
    options: ProvisionOptions,
    shared: dict[str, object],
    steps: Sequence[Step] | None = None,
) -> list[Planned]:
    privileged, why = preflight(conn)
    ctx = StepContext(conn, profile, node, options, privileged, why, shared)
    planned: list[Planned] = []
    for step in steps or all_steps():
        if not options.runs(step.name):
            planned.append(Planned(ctx.entry(step.name, step.name, EntryKind.SKIP, "skipped (--skip/--only)")))
            continue
        if step.needs_sudo and not privileged:
            planned.append(
                Planned(
                    ctx.entry(
                        step.name,
                        step.name,
                        EntryKind.ERROR,
                        f"needs root: {why}",
                        remedy="allow passwordless sudo for the SSH user (ssh.sudo: true), or --skip " + step.name,
                    )
                )
            )
            continue
        try:
            planned.extend(step.plan(ctx))
        except UnreachableError:
            raise
        except InferctlError as exc:
            planned.append(Planned(ctx.entry(step.name, step.name, EntryKind.ERROR, exc.message, remedy=exc.remedy)))
    return planned


def apply_node(
    conn: Connector,
    node: Node,
    profile: Profile,
    options: ProvisionOptions,
    shared: dict[str, object],
    planned: list[Planned],
) -> NodePlan:
    if any(p.entry.kind is EntryKind.ERROR for p in planned):
        return NodePlan(
            node.name,
            tuple(p.entry for p in planned),
            error="not applied: the plan of this node has errors (fix them and plan again)",
        )
    applied: list[PlanEntry] = []
    for item in planned:
        if item.entry.kind is not EntryKind.CHANGE or item.action is None:
            continue
        try:
            item.action()
        except UnreachableError:
            raise
        except InferctlError as exc:
            return NodePlan(
                node.name,
                tuple(p.entry for p in planned),
                error=f"{item.entry.step} ({item.entry.subject}): {exc.message}; later steps not run",
                applied=tuple(applied),
            )
        applied.append(item.entry)
    verify = [p.entry for p in plan_node(conn, node, profile, options, shared)]
    still = [e for e in verify if e.kind is EntryKind.CHANGE]
    error = None
    if still:
        error = "not in the desired state after apply: " + ", ".join(f"{e.step}:{e.subject}" for e in still)
    return NodePlan(node.name, tuple(verify), error=error, applied=tuple(applied))


def _unreachable_plan(outcome: NodeOutcome[object]) -> NodePlan:
    error = outcome.error
    message = error.message if error else "unknown error"
    if error and error.remedy:
        message += f" ({error.remedy})"
    # exit-code-3 errors are "could not look" (unreachable, skipped); others (sudo refused, changed host
    # key) are verdicts and count as errors
    if isinstance(error, NodeSkippedError):
        return NodePlan(outcome.node.name, error=message, skipped=True)
    return NodePlan(outcome.node.name, error=message, unreachable=error is not None and error.exit_code == ExitCode.UNKNOWN)


def plan_fleet(
    fleet: Fleet,
    nodes: Sequence[Node],
    profile: Profile,
    options: ProvisionOptions,
    shared: dict[str, object],
    *,
    fail_fast: bool = False,
) -> FleetPlan:
    outcomes = fleet.map(nodes, lambda conn, node: plan_node(conn, node, profile, options, shared), fail_fast=fail_fast)
    result = FleetPlan([])
    for outcome in outcomes:
        if outcome.value is None:
            result.plans.append(_unreachable_plan(outcome))  # type: ignore[arg-type]
            continue
        result.plans.append(NodePlan(outcome.node.name, tuple(p.entry for p in outcome.value)))
        result.actions[outcome.node.name] = outcome.value
    return result


def apply_fleet(
    fleet: Fleet,
    nodes: Sequence[Node],
    profile: Profile,
    options: ProvisionOptions,
    shared: dict[str, object],
    plan: FleetPlan,
    *,
    rolling: int | None = None,
    fail_fast: bool = False,
    progress: Callable[[NodePlan], None] | None = None,
) -> list[NodePlan]:
    by_name = {p.node: p for p in plan.plans}
    results: dict[str, NodePlan] = {}
    todo = [n for n in nodes if n.name in plan.actions]
    for n in nodes:
        if n.name not in plan.actions:
            results[n.name] = by_name[n.name]
    batch = rolling or len(todo) or 1
    stopped = False
    for start in range(0, len(todo), batch):
        group = todo[start : start + batch]
        if stopped:
            for n in group:
                results[n.name] = NodePlan(
                    n.name, by_name[n.name].entries, error="not applied: --fail-fast stopped the fleet", skipped=True
                )
            continue
        outcomes = fleet.map(
            group,
            lambda conn, node: apply_node(conn, node, profile, options, shared, plan.actions[node.name]),
            fail_fast=fail_fast,
            failed=lambda o: o.error is not None or (o.value is not None and o.value.error is not None),
        )
        for outcome in outcomes:
            node_result = outcome.value if outcome.value is not None else _unreachable_plan(outcome)  # type: ignore[arg-type]
            results[outcome.node.name] = node_result
            if progress:
                progress(node_result)
            if fail_fast and node_result.error:
                stopped = True
    return [results[n.name] for n in nodes]
