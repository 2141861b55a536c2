"""Active diagnostics on demand (never in the default audit: they load the GPUs and the fabric):

- `check gpu --diag N`: `dcgmi diag -r N -j` on every selected node, in parallel, under the node's
  `timeout` (facts/dcgmi.py), judged per test and GPU (core/diag/dcgm.py).
- `check fabric --gdr`: ib_write_bw with `--use_cuda` on both ends between the prefill x decode pairs,
  through the pair-test orchestration of checks/pingpong.py (same schedule, rounds, ports and server
  clean-up); each HCA uses `fabric.gdr.gpu_for_device` or its rail position as the GPU (core/diag/gdr.py).
- `check fabric --nccl`: nccl-tests all_reduce_perf over the selected nodes. `launcher: mpirun` (the
  default) starts ONE mpirun on the first selected node with every node's GPUs as slots (`-H
  host:gpus,...`), which is the only way a multi-node all-reduce crosses the fabric; Open MPI then
  reaches the other nodes over its own SSH (passwordless between the nodes, nodes[].host as the
  address). `launcher: single` runs all_reduce_perf -g N on each node on its own (NVLink/NVSwitch only,
  no MPI needed). Judged by core/diag/nccl.py against fabric.nccl.min_busbw_gbs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infer_ctl.core.diag.dcgm import judge_dcgm
from infer_ctl.core.diag.gdr import judge_gdr
from infer_ctl.core.diag.nccl import judge_nccl
from infer_ctl.core.fabric.expectations import FabricExpectations
from infer_ctl.core.fabric.facts import NodeFabricFacts
from infer_ctl.core.fabric.judge import PairRun, Thresholds
from infer_ctl.core.fabric.pairs import Endpoint
from infer_ctl.core.findings import Finding, Status, worst
from infer_ctl.facts.dcgmi import LEVEL_TIMEOUT_S, DcgmOutputError, diag_command, parse_diag
from infer_ctl.facts.nccl_tests import all_reduce_argv, mpirun_command, parse_all_reduce, single_command
from infer_ctl.facts.perftest_cuda import parse_cuda_init
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Connector

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

DIAG_LEVELS = (1, 2, 3, 4)


# ---- dcgmi diag --------------------------------------------------------------------------------------
def dcgm_node(conn: Connector, node: Node, level: int, timeout_s: float | None = None) -> list[Finding]:
    limit = timeout_s or LEVEL_TIMEOUT_S[level]
    res = conn.run(diag_command(level, timeout_s=limit), timeout=limit + 30)
    said = (res.err or res.out).strip()
    if res.exit_code == 127 or "dcgmi: not found" in said or ("No such file" in said and "dcgmi" in said):
        return judge_dcgm(node.name, None, level, error="dcgmi is not installed on the node")
    if res.timed_out or res.exit_code == 124:
        return judge_dcgm(node.name, None, level, error=f"dcgmi diag -r {level} did not finish within {limit:g}s")
    try:
        diag = parse_diag(res.out)
    except DcgmOutputError as exc:
        # dcgmi prints plain text when it cannot reach its host engine, even with -j
        tail = said.splitlines()[-1] if said else f"exit {res.exit_code}"
        return judge_dcgm(node.name, None, level, error=f"{exc}; dcgmi said: {tail}")
    return judge_dcgm(node.name, diag, level)


def run_dcgm(fleet: Fleet, nodes: Sequence[Node], level: int, timeout_s: float | None = None) -> list[Finding]:
    outcomes = fleet.map(list(nodes), lambda conn, node: dcgm_node(conn, node, level, timeout_s))
    findings: list[Finding] = []
    for o in outcomes:
        if o.error is not None or o.value is None:
            findings.append(Finding.unknown("gpu.diag", o.node.name, "node",
                                            f"dcgmi diag not run: {o.error.message if o.error else 'no result'}",
                                            remedy=(o.error.remedy if o.error else None)
                                            or "check the node with `inferctl nodes`, then rerun"))
        else:
            findings.extend(o.value)
    return findings


# ---- GPUDirect RDMA ------------------------------------------------------------------------------------
def gdr_judge(min_bw_fraction: float) -> Any:
    """The pair judge of `--gdr`: the ordinary ib_write_bw verdict, then the GPU side (core/diag/gdr.py)."""
    from infer_ctl.checks.pingpong import judge

    def judge_one(run: PairRun, th: Thresholds) -> Finding:
        base = judge(run, Thresholds(th.max_rtt_us, min_bw_fraction, th.link_gbps))
        return judge_gdr(base, parse_cuda_init(run.client_text), parse_cuda_init(run.server_text),
                         min_bw_fraction=min_bw_fraction)

    return judge_one


def gpu_for(profile: Profile) -> Any:
    gdr = profile.fabric.gdr

    def hook(ep: Endpoint, rail: int) -> Endpoint:
        from dataclasses import replace

        return replace(ep, cuda_device=gdr.gpu_for_device.get(ep.device, rail))

    return hook


def run_gdr(profile: Profile, fleet: Fleet, nodes: Sequence[Node], facts: dict[str, NodeFabricFacts],
            exps: dict[str, FabricExpectations], *, pair_mode: str | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """ib_write_bw --use_cuda over the pair-test schedule; (findings, a server x client matrix)."""
    from infer_ctl.checks.pingpong import run_pair_tests

    gdr = profile.fabric.gdr
    settings = profile.fabric.pingpong.model_copy(update={"iters": gdr.iters, "bandwidth": True})
    found, summary = run_pair_tests(profile, fleet, nodes, facts, exps, pair_mode=pair_mode, only_tools=["ib_write_bw"],
                                    settings=settings, endpoint_hook=gpu_for(profile),
                                    judge_fn=gdr_judge(gdr.min_bw_fraction))
    return found, gdr_matrix(found, summary)


def gdr_matrix(findings: Sequence[Finding], summary: dict[str, Any]) -> dict[str, Any]:
    cells: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        if f.check == "fabric.gdr" and "server" in f.details:
            cells.setdefault((str(f.details["server"]), str(f.details["client"])), []).append(f)
    out = []
    for (s, c), fs in cells.items():
        bws = [float(f.details["bw_average_gbps"]) for f in fs if f.details.get("bw_average_gbps") is not None]
        status = worst(f.status for f in fs)
        out.append({"server": s, "client": c, "status": status.value,
                    "text": f"{min(bws):.0f} Gb/s" if bws and status is not Status.FAIL else status.value})
    order = [*summary.get("rows", []), *summary.get("columns", [])]
    return {"mode": summary.get("mode"), "tools": ["ib_write_bw --use_cuda"],
            "rows": sorted({c["server"] for c in out}, key=lambda n: order.index(n) if n in order else len(order)),
            "columns": sorted({c["client"] for c in out}, key=lambda n: order.index(n) if n in order else len(order)),
            "cells": out}


# ---- nccl-tests ---------------------------------------------------------------------------------------
def _gpus(profile: Profile, node: Node) -> int:
    return profile.fabric.nccl.gpus_per_node or node.gpus


def run_nccl(profile: Profile, fleet: Fleet, nodes: Sequence[Node]) -> list[Finding]:
    policy = profile.fabric.nccl
    if not nodes:
        return [Finding.warn("fabric.nccl", "fleet", "nodes", "no nodes selected for all_reduce_perf",
                             remedy="select nodes with --nodes/--role")]
    argv_sizes = {"min_bytes": policy.min_bytes, "max_bytes": policy.max_bytes}
    if policy.launcher == "single":
        def one(conn: Connector, node: Node) -> Finding:
            argv = all_reduce_argv(policy.binary, gpus=_gpus(profile, node), **argv_sizes)
            res = conn.run(single_command(argv, policy.timeout_s), timeout=policy.timeout_s + 30)
            return _judge_run(node.name, node.name, res.out + res.err, res.exit_code, res.timed_out, policy,
                              _gpus(profile, node))

        out = []
        for o in fleet.map(list(nodes), one):
            out.append(o.value if o.value is not None else Finding.unknown(
                "fabric.nccl", o.node.name, o.node.name, f"all_reduce_perf not run: {o.error.message if o.error else '?'}",
                remedy="check the node with `inferctl nodes`"))
        return out
    head = nodes[0]
    hosts = [(n.host, _gpus(profile, n)) for n in nodes]
    subject = "+".join(n.name for n in nodes)
    argv = all_reduce_argv(policy.binary, gpus=1, **argv_sizes)
    command = mpirun_command(policy.mpirun, hosts, argv, list(policy.mpirun_args), policy.timeout_s)
    outcome = fleet.map([head], lambda conn, node: conn.run(command, timeout=policy.timeout_s + 30))[0]
    if outcome.error is not None or outcome.value is None:
        return [Finding.unknown("fabric.nccl", head.name, subject,
                                f"all_reduce_perf not started on {head.name}: "
                                f"{outcome.error.message if outcome.error else 'no result'}",
                                remedy="check the node with `inferctl nodes`")]
    res = outcome.value
    return [_judge_run(subject, head.name, res.out + "\n" + res.err, res.exit_code, res.timed_out, policy,
                       sum(n for _, n in hosts))]


def _judge_run(subject: str, node: str, text: str, exit_code: int | None, timed_out: bool, policy: Any,
               ranks: int) -> Finding:
    if timed_out or exit_code == 124:
        return judge_nccl(subject, node, None, policy, exit_code=exit_code,
                          error=f"did not finish within {policy.timeout_s:g}s (fabric.nccl.timeout_s)")
    tool = policy.mpirun if policy.launcher == "mpirun" else policy.binary
    if exit_code == 127 or f"{tool}: not found" in text or f"{tool}: command not found" in text:
        return judge_nccl(subject, node, None, policy, exit_code=exit_code, error=f"{tool} is not installed on {node}")
    run = parse_all_reduce(text)
    if not run.rows and not run.errors and exit_code != 0:
        tail = text.strip().splitlines()[-1] if text.strip() else f"exit {exit_code}"
        return judge_nccl(subject, node, None, policy, exit_code=exit_code, error=tail)
    return judge_nccl(subject, node, run, policy, exit_code=exit_code, expected_ranks=ranks)


__all__ = ["DIAG_LEVELS", "dcgm_node", "gdr_judge", "gdr_matrix", "run_dcgm", "run_gdr", "run_nccl"]
