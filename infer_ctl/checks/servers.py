"""`check servers`: every SGLang instance is healthy and runs what the profile says.

Gathers over HTTP (from the controller: /health, /server_info, /v1/loads) and over SSH (the deployed
files and the running process of each instance, systemd's verdict on its unit, a TCP connect from each
decode node to each prefill's bootstrap port), then judges with core.sglang.judge and
core.sglang.deployed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infer_ctl.checks.hicache import hicache_findings
from infer_ctl.checks.registry import AuditContext, CheckFamily
from infer_ctl.core.engine_identity import identify
from infer_ctl.core.findings import Finding
from infer_ctl.core.sglang import Instance, build_argv, env_file_path, instances, server_args
from infer_ctl.core.sglang.deployed import judge_files, judge_restart_pending, parse_env_file
from infer_ctl.core.sglang.judge import (
    expected_server_args,
    judge_bootstrap,
    judge_drift,
    judge_env_drift,
    judge_loads,
    judge_pd_agreement,
)
from infer_ctl.launch import deploy, probe, running, supervisor
from infer_ctl.profile import Node, Profile
from infer_ctl.remote.base import Command, Connector

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

# One line per target: "<host> <port> <rc>". bash's /dev/tcp, else python3, else nc; 127 = no tool.
_CONNECT_SCRIPT = r"""
probe() {
  if command -v bash >/dev/null 2>&1; then timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; return $?; fi
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3).close()' "$1" "$2" 2>/dev/null; return $?
  fi
  if command -v nc >/dev/null 2>&1; then nc -z -w 3 "$1" "$2" 2>/dev/null; return $?; fi
  return 127
}
while [ $# -ge 2 ]; do probe "$1" "$2"; echo "$1 $2 $?"; shift 2; done
"""


def _http_findings(profile: Profile, leaders: list[Instance]) -> tuple[list[Finding], dict[Instance, Any]]:
    findings: list[Finding] = []
    infos: dict[Instance, Any] = {}
    with probe.client(timeout=5.0) as http:
        for inst in leaders:
            h = probe.health(http, inst)
            if not h.ok:
                findings.append(
                    Finding.fail(
                        "servers.health",
                        inst.node,
                        inst.name,
                        f"{inst.url}/health: {h.error}",
                        remedy=f"`inferctl status`, `inferctl logs {inst.name}`; relaunch with `inferctl launch`",
                    )
                )
                if h.status is not None:
                    # something answers HTTP on the port but not SGLang's /health: name what it is (a
                    # relaunch cannot bind a port another program holds)
                    other = probe.server_info(http, inst)
                    if other.status is not None:
                        ident = _engine_finding(profile, inst, other)
                        if ident.status != "ok":
                            findings.append(ident)
                continue
            findings.append(Finding.ok("servers.health", inst.node, inst.name, f"healthy at {inst.url}"))
            info = probe.server_info(http, inst)
            if info.status is not None:  # it answered: judge what it is (a timeout says nothing about that)
                findings.append(_engine_finding(profile, inst, info))
            if not info.ok:
                findings.append(
                    Finding.unknown(
                        "servers.drift", inst.node, inst.name, f"/server_info: {info.error}",
                        remedy="check that the server is SGLang >= 0.5 (it serves /server_info)",
                    )
                )  # fmt: skip
            else:
                infos[inst] = info.data
                argv = build_argv(profile, inst).argv
                expected = expected_server_args(inst, argv)
                findings.extend(judge_drift(inst, expected, info.data, launch_args=server_args(argv)))
            ld = probe.loads(http, inst)
            if ld.ok:
                findings.extend(judge_loads(inst, ld.data))
    return findings, infos


def _engine_finding(profile: Profile, inst: Instance, info: Any) -> Finding:
    """servers.engine: SGLang at the pinned version, another version (WARN), the simulator (OK, named), or
    another program answering on the port (FAIL: nothing inferctl judges of it means anything)."""
    ident = identify(info.data if info.ok else None, pinned=profile.sglang.version, status=info.status or 0)
    if ident.kind == "not-sglang":
        return Finding.fail("servers.engine", inst.node, inst.name, f"{inst.url}: {ident.summary}",
                            remedy=f"`curl {inst.url}/get_server_info`: an SGLang older than 0.5 answers it "
                                   "(relaunch with the pinned venv: `inferctl provision --apply`); otherwise another "
                                   f"program holds port {inst.url.rsplit(':', 1)[-1]}: find it with `ss -ltnp` on "
                                   f"{inst.node}, stop it, then `inferctl launch --nodes {inst.node}`")
    if ident.kind == "other-version":
        return Finding.warn("servers.engine", inst.node, inst.name, f"{inst.url}: {ident.summary}",
                            remedy=f"relaunch with the pinned venv (`inferctl provision --apply`, then "
                                   f"`inferctl launch --nodes {inst.node}`), or pin sglang.version: {ident.version}")
    return Finding.ok("servers.engine", inst.node, inst.name, f"{inst.url}: {ident.summary}")


def _bootstrap_findings(
    profile: Profile, fleet: Fleet, decodes: list[Instance], prefills: list[Instance]
) -> list[Finding]:
    if not decodes or not prefills:
        return []
    targets = [x for p in prefills for x in (p.host, str(p.bootstrap_port))]
    nodes = [profile.node(n) for n in dict.fromkeys(d.node for d in decodes)]

    def gather(conn: Connector, node: Node) -> dict[tuple[str, str], int]:
        res = conn.run(Command("sh", "-c", _CONNECT_SCRIPT, "inferctl", *targets), timeout=30)
        rcs = {}
        for line in res.out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[2].isdigit():
                rcs[(parts[0], parts[1])] = int(parts[2])
        return rcs

    out: list[Finding] = []
    for o in fleet.map(nodes, gather):
        node_decodes = [d for d in decodes if d.node == o.node.name]
        if o.error is not None:
            out.append(
                Finding.unknown(
                    "servers.bootstrap", o.node.name, o.node.name, o.error.message, remedy=o.error.remedy
                )
            )
            continue
        for d in node_decodes[:1]:  # one connect per node and prefill: decodes on a node share the network
            for p in prefills:
                out.append(judge_bootstrap(d, p, (o.value or {}).get((p.host, str(p.bootstrap_port)))))
    return out


def _deployed(profile: Profile, fleet: Fleet, insts: list[Instance]) -> tuple[set[str], list[Finding]]:
    """Names of instances `inferctl launch` has deployed (their env file exists on the node). A server the
    profile declares but that was never launched is a FAIL like one that is down: the profile says the
    cluster serves with it, the router would route to it, and `inferctl status` fails it too (issue 29:
    status, `check servers` and `audit` disagreed on a cluster never launched). Before the first launch,
    `audit --only gpu,fabric` judges the nodes without their servers."""
    by_node: dict[str, list[Instance]] = {}
    for i in insts:
        by_node.setdefault(i.node, []).append(i)

    def gather(conn: Connector, node: Node) -> tuple[set[str], dict[str, list[Finding]]]:
        paths = [env_file_path(i) for i in by_node[node.name]]
        res = conn.run(
            Command("sh", "-c", 'for f; do [ -f "$f" ] && echo "$f"; done; true', "inferctl", *paths)
        )
        found = set(res.out.split())
        mine = [i for i in by_node[node.name] if env_file_path(i) in found]
        sup = supervisor.detect_supervisor(conn, profile) if mine else "process"
        return found, {i.name: _node_findings(conn, profile, i, sup) for i in mine}

    deployed: set[str] = set()
    findings: list[Finding] = []
    for o in fleet.map([profile.node(n) for n in by_node], gather):
        found, per_instance = o.value or (set(), {})
        for i in by_node[o.node.name]:
            if o.error is not None:
                findings.append(
                    Finding.unknown(
                        "servers.deployed", i.node, i.name, o.error.message, remedy=o.error.remedy
                    )
                )
            elif env_file_path(i) in found:
                deployed.add(i.name)
                findings.extend(per_instance.get(i.name, []))
            else:
                findings.append(
                    Finding.fail(
                        "servers.deployed",
                        i.node,
                        i.name,
                        f"the profile declares this {i.role} server, but it was never launched here (no "
                        f"{env_file_path(i)}), so it is not serving",
                        details={"url": i.url, "env_file": env_file_path(i)},
                        remedy=f"run `inferctl launch --nodes {i.node}` to start it (or remove the node's "
                        "role from the profile)",
                    )
                )
    return deployed, findings


def _node_findings(conn: Connector, profile: Profile, inst: Instance, sup: supervisor.Supervisor) -> list[Finding]:
    """On the node of a deployed instance: systemd's start limit; the deployed files against what the
    profile renders now (with the GID index read from the node, as launch does); the running process
    against the deployed files (restart pending) and its environment against the profile's (drift)."""
    out: list[Finding] = []
    if sup == "systemd":
        unit = supervisor.unit_result(conn, inst)
        if unit.start_limit_hit:
            out.append(supervisor.start_limit_finding("servers.start_limit", inst, unit))
    view = running.inspect(conn, inst, sup, sudo=profile.ssh.sudo)
    plan = deploy.deployment(conn, profile, inst, sup)
    if plan.refused:
        out.append(
            Finding.fail(
                "servers.files",
                inst.node,
                inst.name,
                f"the profile's env file cannot be rendered: MC_GID_INDEX cannot be determined: {plan.refused}",
                remedy="run `inferctl check fabric` on the node; fix the HCA, or pin nodes[].rdma.gid_index",
            )
        )
    else:
        out.extend(judge_files(inst, [(f.path, f.text) for f in plan.files], view.files))
    if view.running is None:
        return out  # not running: servers.health says so (rank 0), or there is nothing to compare
    env_path, command_path = env_file_path(inst), running.command_file_path(inst, sup)
    out.extend(judge_restart_pending(inst, env_path, view.files.get(env_path), command_path,
                                     view.files.get(command_path), view.running))  # fmt: skip
    if not plan.refused and view.running.environ is not None:
        rendered_env = parse_env_file(next(f.text for f in plan.files if f.path == env_path))
        out.extend(judge_env_drift(inst, rendered_env, view.running.environ))
    return out


def check_servers(profile: Profile, fleet: Fleet, nodes: list[Node]) -> list[Finding]:
    names = {n.name for n in nodes}
    every = instances(profile)
    deployed, findings = _deployed(profile, fleet, [i for i in every if i.node in names])
    leaders = [i for i in every if i.is_leader and i.name in deployed]
    http_findings, infos = _http_findings(profile, leaders)
    findings.extend(http_findings)
    findings.extend(judge_pd_agreement(infos))
    findings.extend(hicache_findings(profile, list(infos)))  # HiCache tiers of the healthy servers (checks/hicache.py)
    prefills = [i for i in every if i.role == "prefill" and i.is_leader]
    decodes = [i for i in every if i.role == "decode" and i.name in deployed]
    findings.extend(_bootstrap_findings(profile, fleet, decodes, prefills))
    return findings


def _run(ctx: AuditContext) -> list[Finding]:
    # every finding, as `check servers` gives them: the JSON document promises all of them
    return check_servers(ctx.profile, ctx.fleet, ctx.nodes)


FAMILY = CheckFamily(
    name="servers",
    description="SGLang servers: health, drift from the profile, P/D agreement, bootstrap reachability, queues",
    run=_run,
)
