"""Pair tests over the fleet: ibv_rc_pingpong (always) and perftest ib_write_lat / ib_write_bw
(when installed on both ends and enabled) between the node pairs of core.fabric.pairs.

Per test, in order:
1. start the server detached on its node (`timeout` bounds it), and wait on that node until the
   TCP port is in LISTEN state in /proc/net/tcp{,6}. Probing the port from the client would be
   taken by the server's accept() as the client, so readiness is observed on the server side;
2. run the client (same flags, plus the server's address) under the connector's timeout;
3. collect the server: wait a little for it to print its result, TERM it if it is still running,
   read its output and exit code, remove its temporary directory. Step 3 also runs in `finally`,
   so servers are cleaned up whatever happened to the client.
Rounds run one after the other; the tests of one round (disjoint HCAs, distinct ports) run in parallel.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from infer_ctl.checks.pair_hosts import resolved_hosts
from infer_ctl.core.fabric.endpoints import node_endpoints, path_mtu, slower_rate
from infer_ctl.core.fabric.expectations import FabricExpectations
from infer_ctl.core.fabric.facts import NodeFabricFacts
from infer_ctl.core.fabric.judge import PairRun, Thresholds, judge_pair, pair_matrix
from infer_ctl.core.fabric.matrix import pair_summary
from infer_ctl.core.fabric.pairs import (
    Endpoint,
    PairFlags,
    PairTest,
    perftest_argv,
    rc_pingpong_argv,
    rounds,
    schedule,
    select_pairs,
)
from infer_ctl.core.findings import Finding
from infer_ctl.errors import InferctlError
from infer_ctl.facts.rdma_pingpong import parse_pair_output
from infer_ctl.profile import Node, PingPongSettings, Profile, Role
from infer_ctl.remote.base import Command, Connector

if TYPE_CHECKING:
    from infer_ctl.remote.fleet import Fleet

#: the check ids of pair tests (their findings are keyed on the server node)
PAIR_CHECKS = ("fabric.pingpong", "fabric.write_lat", "fabric.write_bw", "fabric.gdr")

# The server start script: $1 port, $2 limit (s), then the server argv. Prints DIR/PID/READY lines.
START = r"""
port=$1; limit=$2; shift 2
command -v "$1" >/dev/null 2>&1 || { echo "MISSING $1"; exit 0; }
hex=$(printf '%04X' "$port")
listening() { cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q "^ *[0-9]*: [0-9A-F]*:$hex [0-9A-F]*:[0-9A-F]* 0A"; }
if listening; then echo "BUSY $port"; exit 0; fi
d=$(mktemp -d "${TMPDIR:-/tmp}/inferctl-pp.XXXXXX") || exit 1
echo "DIR $d"
( timeout -k 2 "$limit" "$@" </dev/null >"$d/out" 2>&1 & echo $! >"$d/pid"; wait $!; echo $? >"$d/rc" ) \
  </dev/null >/dev/null 2>&1 &
i=0
while [ $i -lt 200 ]; do
  if listening; then echo READY; exit 0; fi
  if [ -f "$d/rc" ]; then echo EXITED; exit 0; fi
  sleep 0.05; i=$((i+1))
done
echo NOTREADY
"""

# The server collect script: $1 dir, $2 polls of 50 ms to wait for a natural exit.
FINISH = r"""
d=$1; n=$2
case "$d" in */inferctl-pp.*) ;; *) echo "BADDIR"; exit 0;; esac
[ -d "$d" ] || { echo "NODIR"; exit 0; }
i=0
while [ ! -f "$d/rc" ] && [ $i -lt "$n" ]; do sleep 0.05; i=$((i+1)); done
if [ ! -f "$d/rc" ]; then
  echo KILLED
  pid=$(cat "$d/pid" 2>/dev/null)
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  j=0; while [ ! -f "$d/rc" ] && [ $j -lt 40 ]; do sleep 0.05; j=$((j+1)); done
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
  # the killed server's subshell writes rc right after: let it, or it lands while rm empties the dir
  j=0; while [ ! -f "$d/rc" ] && [ $j -lt 40 ]; do sleep 0.05; j=$((j+1)); done
fi
echo "RC $(cat "$d/rc" 2>/dev/null)"
echo "--- output"
cat "$d/out" 2>/dev/null
# a file written between rm's emptying and its rmdir leaves the dir (ENOTEMPTY): once more
rm -rf "$d" 2>/dev/null || { sleep 0.2; rm -rf "$d"; }
"""


def _start(conn: Connector, argv: list[str], port: int, limit: float) -> tuple[str, str | None, str]:
    res = conn.run(Command("sh", "-c", START, "inferctl-pp-start", str(port), f"{limit:g}", *argv), timeout=30)
    words: dict[str, str] = {}
    for ln in res.out.splitlines():
        key, _, value = ln.strip().partition(" ")
        if key:
            words[key] = value
    for state in ("READY", "NOTREADY", "EXITED", "MISSING", "BUSY"):
        if state in words:
            return state, words.get("DIR") or None, res.out
    return "FAILED", words.get("DIR") or None, (res.out + res.err)


def _finish(conn: Connector, d: str, polls: int) -> tuple[int | None, str, bool]:
    res = conn.run(Command("sh", "-c", FINISH, "inferctl-pp-finish", d, str(polls)), timeout=30)
    head, _, output = res.out.partition("--- output\n")
    rc = None
    for line in head.splitlines():
        if line.startswith("RC ") and line[3:].strip().isdigit():
            rc = int(line[3:].strip())
    return rc, output, "KILLED" in head


def run_one(fleet: Fleet, nodes: dict[str, Node], test: PairTest, tool: str, flags: PairFlags, timeout_s: float,
            address_source: str | None = None) -> PairRun:
    s, c = test.server, test.client
    build = rc_pingpong_argv if tool == "ibv_rc_pingpong" else (lambda ep, fl, p, h=None: perftest_argv(tool, ep, fl, p, h))
    # the client is given the server's data-plane address (core/fabric/endpoints.py), not the profile's host
    server_argv, client_argv = build(s, flags, test.tcp_port), build(c, flags, test.tcp_port, s.host)
    run = PairRun(test, tool, False, None, "", None, "", server_address_source=address_source)
    d: str | None = None
    try:
        sconn = fleet.connector(nodes[s.node])
        cconn = fleet.connector(nodes[c.node])
        state, d, text = _start(sconn, server_argv, test.tcp_port, timeout_s + 5)
        run.server_text = text if state != "READY" else ""
        if state == "MISSING":
            run.server_text = f"{tool} is not installed on {s.node}"
        elif state == "BUSY":
            run.server_text = f"Couldn't listen: TCP port {test.tcp_port} is already in use on {s.node}"
        if state != "READY":
            if d:
                run.server_exit, out, _ = _finish(sconn, d, 20)
                run.server_text = out or run.server_text
                d = None
            return run
        run.server_ready = True
        assert d is not None  # READY is printed only after DIR
        res = cconn.run(Command(*client_argv), timeout=timeout_s)
        run.client_exit, run.client_text, run.client_timed_out = res.exit_code, res.out + res.err, res.timed_out
        run.server_exit, run.server_text, killed = _finish(sconn, d, 100 if res.ok else 10)
        d = None
        run.server_timed_out = killed and res.ok
        if killed and not res.ok:
            run.server_exit = None  # we stopped it because the client had already failed
        return run
    except InferctlError as exc:
        run.error = exc.message
        return run
    finally:
        if d is not None:  # the client side blew up: never leave a server behind
            try:
                _finish(fleet.connector(nodes[s.node]), d, 0)
            except InferctlError:
                pass


def judge(run: PairRun, th: Thresholds) -> Finding:
    """Parse both ends' output with the tool's parser, then judge the pair."""
    return judge_pair(run, parse_pair_output(run.tool, run.client_text), parse_pair_output(run.tool, run.server_text), th)


def run_pair_tests(profile: Profile, fleet: Fleet, nodes: Sequence[Node], facts: dict[str, NodeFabricFacts],
                   exps: dict[str, FabricExpectations], *, pair_mode: str | None = None,
                   only_tools: Sequence[str] | None = None, settings: PingPongSettings | None = None,
                   endpoint_hook: Callable[[Endpoint, int], Endpoint] | None = None,
                   judge_fn: Callable[[PairRun, Thresholds], Finding] | None = None,
                   ) -> tuple[list[Finding], dict[str, Any]]:
    """The pair tests between the reachable nodes (`facts`): their findings, in report order, and the
    matrix summary (`pairs` of `check fabric --json`). `only_tools`, `settings`, `endpoint_hook` (each
    node's i-th endpoint -> the one to test, e.g. with a GPU for --use_cuda) and `judge_fn` let an active
    diagnostic (checks/diag.py, `check fabric --gdr`) run its own tool over the same schedule."""
    settings = settings or profile.fabric.pingpong
    by_name = {n.name: n for n in nodes}
    out: list[Finding] = []
    resolved = resolved_hosts(profile, nodes)
    infos = {n.name: node_endpoints(n, facts[n.name], exps[n.name], resolved.get(n.name))
             for n in nodes if n.name in facts}
    if endpoint_hook is not None:
        infos = {name: [replace(i, endpoint=endpoint_hook(i.endpoint, k)) for k, i in enumerate(eps)]
                 for name, eps in infos.items()}
    usable = {name: [i.endpoint for i in eps] for name, eps in infos.items() if eps}
    mode = pair_mode or settings.pairs
    names = [n.name for n in nodes]
    pairs = select_pairs(mode, [n.name for n in nodes if n.has_role(Role.PREFILL)],
                         [n.name for n in nodes if n.has_role(Role.DECODE)], names, settings.explicit_pairs)
    if not pairs:
        out.append(Finding.warn(
            "fabric.pingpong", "fleet", "pairs", f"no node pairs to test in mode {mode!r} among the selected nodes",
            remedy="select prefill and decode nodes, use --pairs mesh, or fill fabric.pingpong.explicit_pairs"))
    why_not: dict[str, str] = {}
    for node in sorted({x for p in pairs for x in p} - set(usable)):
        why = "not reachable" if node not in facts else "no ACTIVE device with a RoCE v2 GID"
        why_not[node] = f"{node} {why}"
        # its pairs did not run: audit --since-last reports their earlier problems as not checked, whichever
        # end this node was (pair findings are keyed on the server, subject "server/dev <-> client/dev")
        untested = [[check, pattern] for check in PAIR_CHECKS for pattern in (f"{node}/*", f"* <-> {node}/*")]
        out.append(Finding.fail("fabric.pingpong", node, node, f"{node} cannot take part in pair tests: {why}",
                                details={"not_gathered_subjects": untested},
                                remedy="fix the node findings above (fabric.devices/port_state/gid) first"))
    tests = schedule(pairs, usable, settings.base_port)
    tools = ["ibv_rc_pingpong"]
    for tool, wanted in (("ib_write_lat", settings.perftest), ("ib_write_bw", settings.bandwidth)):
        if wanted and tests and all(_has(facts[n], tool) for n in usable):
            tools.append(tool)
    if only_tools is not None:  # run these whether or not the node reported them: a missing one says so
        tools = list(only_tools)
    info_of = {(i.endpoint.node, i.endpoint.device): i for eps in infos.values() for i in eps}
    findings: list[Finding] = []
    for tool_index, tool in enumerate(tools):
        offset = tool_index * len(tests)
        for group in rounds(tests):
            with cf.ThreadPoolExecutor(max_workers=max(1, min(len(group), 16))) as pool:
                futures = []
                for t in group:
                    t2 = PairTest(t.server, t.client, t.tcp_port + offset, t.round)
                    a, b = info_of[(t.server.node, t.server.device)], info_of[(t.client.node, t.client.device)]
                    flags = PairFlags(settings.size, settings.iters, path_mtu(profile.fabric.mtu, a, b))
                    th = Thresholds(settings.max_rtt_us, settings.min_bw_fraction, slower_rate(a, b))
                    futures.append((pool.submit(run_one, fleet, by_name, t2, tool, flags, settings.timeout_s,
                                                a.address_source), th))
                findings += [(judge_fn or judge)(f.result(), th) for f, th in futures]
    return out + findings, pair_summary(mode, tools, names, pairs, pair_matrix(findings), why_not)


def _has(facts: NodeFabricFacts, tool: str) -> bool:
    return facts.sysfs is None or not facts.sysfs.tools or tool in facts.sysfs.tools


__all__ = ["FINISH", "START", "judge", "run_one", "run_pair_tests"]
