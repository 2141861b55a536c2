"""`check gpu`: gather every GPU fact of a node in ONE remote command, judge with core/gpu/rules.py.

Per node: the NVML gatherer runs as `python3 -` with its script on stdin (falling back to nvidia-smi on
the node itself), plus the kernel log's XIDs, all through the fleet's single connection to that node.
A node that cannot be reached, has no python3 or no driver yields one clear UNKNOWN finding; the rest of
the fleet is still checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infer_ctl.checks.registry import AuditContext, CheckFamily
from infer_ctl.core.findings import Finding
from infer_ctl.core.gpu.facts import NodeGpuFacts
from infer_ctl.core.gpu.rules import judge_fleet, judge_node
from infer_ctl.facts.nvml_gatherer import (
    GathererOutputError,
    gather_command,
    gatherer_script,
    parse_gatherer_output,
)
from infer_ctl.profile import Node, Profile
from infer_ctl.profile.gpu import GpuPolicy
from infer_ctl.remote.base import Connector
from infer_ctl.remote.fleet import Fleet


def _failed(message: str, kind: str = "tool_failed") -> NodeGpuFacts:
    return NodeGpuFacts(source="none", error=message, error_kind=kind, xid_error=message)


def gather_gpu_facts(conn: Connector, node: Node, policy: GpuPolicy) -> NodeGpuFacts:
    """One remote command per node: everything the GPU rules need."""
    # the node-side tools get the timeout minus a margin for SSH and interpreter start-up, so the
    # gatherer reports a hung tool itself instead of being killed with everything it already read
    command = gather_command(
        policy.python,
        source=policy.facts_source,
        window_h=policy.xid_window_h,
        budget_s=max(1.0, policy.timeout_s - min(5.0, policy.timeout_s / 4)),
    )
    result = conn.run(command, timeout=policy.timeout_s, stdin=gatherer_script())
    if result.timed_out:
        return _failed(f"GPU fact gathering timed out after {policy.timeout_s:g}s (a hung driver or nvidia-smi?)")
    err = result.err.strip()
    if result.exit_code == 127 or (result.exit_code != 0 and "not found" in err and policy.python in err):
        return _failed(
            f"{policy.python} not found on the node, so GPU facts cannot be gathered",
            "no_python",
        )
    try:
        return parse_gatherer_output(result.out)
    except GathererOutputError as exc:
        tail = err.splitlines()[-1] if err else f"exit {result.exit_code}"
        return _failed(f"{exc}; the gatherer said: {tail}")


def _expected_count(node: Node, policy: GpuPolicy) -> int:
    return policy.expected_count if policy.expected_count is not None else node.gpus


#: what a gpu.facts finding did not check: every GPU rule of the node (audit --since-last reports earlier
#: problems there as "not checked", never as recovered)
NOT_GATHERED = ("gpu.*",)


def _unreachable(node: Node, message: str, remedy: str | None) -> Finding:
    return Finding.unknown(
        "gpu.facts", node.name, "node", f"GPU facts not gathered: {message}",
        details={"not_gathered": list(NOT_GATHERED)},
        remedy=remedy or "check the node with `inferctl nodes`, then rerun the check",
    )


def check_gpu(
    fleet: Fleet, nodes: Sequence[Node], profile: Profile, memory: Mapping[str, Any] | None = None
) -> list[Finding]:
    """`memory`: what earlier audits remembered ({check: {node: {subject: value}}}, checks/audit.py):
    XIDs of earlier boots, PCIe replay counters; `check gpu` alone has none."""
    memory = memory or {}
    outcomes = fleet.map(
        list(nodes), lambda conn, node: gather_gpu_facts(conn, node, profile.gpu_policy_for(node))
    )
    findings: list[Finding] = []
    gathered: list[tuple[str, NodeGpuFacts]] = []
    for outcome in outcomes:
        node = outcome.node
        policy = profile.gpu_policy_for(node)
        if outcome.error is not None or outcome.value is None:
            err = outcome.error
            findings.append(_unreachable(node, err.message if err else "no result", err.remedy if err else None))
            continue
        facts = outcome.value
        if facts.error_kind == "no_python":
            findings.append(
                Finding.unknown(
                    "gpu.facts", node.name, "node", facts.error or "no python3",
                    details={"not_gathered": list(NOT_GATHERED)},
                    remedy="install python3 on the node, or point `gpu.python` at an interpreter "
                    "(e.g. the provisioned venv's bin/python)",
                )
            )
            continue
        gathered.append((node.name, facts))
        mine = {check: by_node.get(node.name) or {} for check, by_node in memory.items() if isinstance(by_node, Mapping)}
        findings.extend(judge_node(node.name, facts, policy, _expected_count(node, policy), mine))
    findings.extend(judge_fleet(gathered))
    return findings


def _run(ctx: AuditContext) -> list[Finding]:
    return check_gpu(ctx.fleet, ctx.nodes, ctx.profile, ctx.options.get("memory"))


FAMILY = CheckFamily(
    name="gpu",
    description="GPU count, driver, ECC, row remap, XIDs and SXids, temperature (core, HBM), throttling, PCIe (link, replay rate), NVLink, NVSwitch fabric, MIG, power limit, InfoROM, VBIOS",
    run=_run,
)
