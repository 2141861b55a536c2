"""The provisioning workflow over a fleet: parse the step options, plan, confirm and apply the very plan
that was confirmed, roll a venv back, and build the report. The `provision` commands (cli/) call it,
so their typer functions stay thin."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from infer_ctl.core.provision.model import NodePlan, fleet_exit_code
from infer_ctl.core.report import Report
from infer_ctl.errors import InferctlError, UsageError
from infer_ctl.exitcodes import ExitCode
from infer_ctl.profile import Profile
from infer_ctl.profile.select import select_nodes
from infer_ctl.provision.context import DEFAULT_KEEP_BACKUPS, ProvisionOptions
from infer_ctl.provision.runner import FleetPlan, apply_fleet, plan_fleet, shared_inputs
from infer_ctl.provision.steps.registry import step_names
from infer_ctl.provision.venv_links import rollback
from infer_ctl.remote.fleet import Fleet


def parse_steps(value: str | None, flag: str) -> frozenset[str] | None:
    if not value:
        return None
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    unknown = sorted(names - set(step_names()))
    if unknown:
        raise UsageError(f"{flag}: unknown step(s) {', '.join(unknown)}", remedy=f"steps: {', '.join(step_names())}")
    return names


def at_least(flag: str, value: int | None, lowest: int, example: str) -> None:
    """Every numeric option is checked before anything is planned: typer accepts any int, and
    `--hugepages -7` would otherwise be planned as `vm.nr_hugepages = -7`."""
    if value is not None and value < lowest:
        raise UsageError(f"{flag} must be at least {lowest}, got {value}", remedy=f"e.g. {flag} {example}")


def make_options(
    skip: str | None,
    only: str | None,
    wheelhouse: Path | None,
    hugepages: int | None,
    restart: bool,
    keep_backups: int | None = None,
) -> ProvisionOptions:
    if wheelhouse is not None and not wheelhouse.is_dir():
        raise UsageError(f"--wheelhouse {wheelhouse}: not a directory", remedy="give the directory `wheelhouse build` wrote")
    at_least("--hugepages", hugepages, 0, "1024 (2 MiB pages; Mooncake Store/HiCache only)")
    at_least("--keep-backups", keep_backups, 1, "5")
    return ProvisionOptions(
        skip=parse_steps(skip, "--skip") or frozenset(),
        only=parse_steps(only, "--only"),
        wheelhouse=wheelhouse,
        hugepages=hugepages,
        restart=restart,
        keep_backups=keep_backups if keep_backups is not None else DEFAULT_KEEP_BACKUPS,
    )


def provision_report(command: str, profile: Profile, plans: list[NodePlan], *, apply: bool) -> Report:
    code = fleet_exit_code(plans)
    return Report(
        command,
        profile.name,
        results=[p.to_dict() for p in plans],
        data={"mode": "apply" if apply else "plan"},
        exit_code_override=code,
    )


def run_provision(
    profile: Profile,
    *,
    nodes: str | None,
    role: str | None,
    options: ProvisionOptions,
    apply: bool,
    yes: bool,
    rolling: int | None,
    fail_fast: bool,
    parallel: int | None,
    confirm: Callable[[FleetPlan], bool],
) -> list[NodePlan]:
    """Plan; for apply, confirm (unless --yes) and execute the very plan that was confirmed."""
    at_least("--rolling", rolling, 1, "1 (one node at a time)")
    at_least("--parallel", parallel, 1, "8")
    selected = select_nodes(profile, nodes, role)
    shared = shared_inputs(profile, options)
    with Fleet(profile, parallel=parallel) as fleet:
        plan = plan_fleet(fleet, selected, profile, options, shared, fail_fast=fail_fast)
        if not apply or plan.changes == 0:
            return plan.plans
        if not yes and not confirm(plan):
            raise InferctlError("apply cancelled; nothing was changed", exit_code=ExitCode.WARN)
        return apply_fleet(fleet, selected, profile, options, shared, plan, rolling=rolling, fail_fast=fail_fast)


def require_interactive(json_mode: bool) -> None:
    if json_mode or not sys.stdin.isatty():
        raise UsageError(
            "--apply asks for confirmation, but this session is not interactive",
            remedy="review `inferctl provision --plan`, then rerun with --apply --yes",
        )


def run_rollback(profile: Profile, nodes: str | None, role: str | None, parallel: int | None) -> list[dict[str, object]]:
    at_least("--parallel", parallel, 1, "8")
    selected = select_nodes(profile, nodes, role)
    venvs = profile.sglang.venv
    with Fleet(profile, parallel=parallel) as fleet:
        outcomes = fleet.map(selected, lambda conn, node: rollback(conn, venvs))
    results: list[dict[str, object]] = []
    for o in outcomes:
        if o.value is not None:
            results.append({"node": o.node.name, "state": "applied", "from": o.value[0], "to": o.value[1], "error": None})
        else:
            err = o.error
            results.append({"node": o.node.name, "state": "error", "error": err.message if err else "?",
                            "remedy": err.remedy if err else None,
                            "exit_code": int(err.exit_code) if err else 2})
    return results
