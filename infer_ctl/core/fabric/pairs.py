"""Which node pairs run a pair test, on which devices, in which round, on which TCP port.

Pure scheduling, so the order and the port allocation are tested without hosts:

- pairs: `prefill-decode` (every prefill node against every decode node: the KV paths; the prefill
  node is the server), `mesh` (every unordered pair once, in profile order) or `explicit`.
- rails: device i of one end against device i of the other (rail-aligned fabrics connect mlx5_k of
  every node to the same leaf), up to the shorter device list.
- rounds: a test only shares a round with tests that touch neither of its two HCAs, so no HCA runs
  two tests at once (a shared HCA would skew the latency being measured). Rounds are filled greedily
  in pair order, which for prefill x decode reaches the lower bound (the largest per-HCA degree).
- ports: test k gets `base_port + k`. Ports are unique across the whole run, so parallel servers on
  one node never collide and a port is never reused while a previous server may still linger.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infer_ctl.errors import UsageError

PairMode = str  # "prefill-decode" | "mesh" | "explicit"


@dataclass(frozen=True)
class Endpoint:
    node: str
    host: str
    device: str
    #: local sgid index (-g / -x); None on InfiniBand, where no GRH is needed
    gid_index: int | None
    ib_port: int = 1
    #: perftest reads and writes this GPU's memory (--use_cuda=N: GPUDirect RDMA, `check fabric --gdr`)
    cuda_device: int | None = None


@dataclass(frozen=True)
class PairTest:
    server: Endpoint
    client: Endpoint
    tcp_port: int
    round: int

    @property
    def label(self) -> str:
        return f"{self.server.node}/{self.server.device} <-> {self.client.node}/{self.client.device}"


@dataclass(frozen=True)
class PairFlags:
    """Flags both sides must share (rc_pingpong's TCP sync does not check them)."""

    size: int = 4096
    iters: int = 1000
    #: path MTU; the smaller of both active MTUs and the profile's MTU
    mtu: int = 1024


def select_pairs(
    mode: PairMode,
    prefill: Sequence[str],
    decode: Sequence[str],
    all_nodes: Sequence[str],
    explicit: Sequence[tuple[str, str]] = (),
) -> list[tuple[str, str]]:
    """(server, client) node names, in the order tests are scheduled."""
    if mode == "prefill-decode":
        return [(p, d) for p in prefill for d in decode if p != d]
    if mode == "mesh":
        return [(a, b) for i, a in enumerate(all_nodes) for b in all_nodes[i + 1 :]]
    if mode == "explicit":
        known = set(all_nodes)
        out = []
        for a, b in explicit:
            if a == b:
                raise UsageError(f"pair {a}-{b}: a node cannot be tested against itself",
                                 remedy="fix fabric.pingpong.explicit_pairs")
            if a in known and b in known:
                out.append((a, b))
        return out
    raise UsageError(f"unknown pair mode {mode!r}", remedy="use prefill-decode, mesh or explicit")


def schedule(
    pairs: Sequence[tuple[str, str]],
    endpoints: Mapping[str, Sequence[Endpoint]],
    base_port: int,
) -> list[PairTest]:
    """Expand node pairs into rail tests, assign rounds and ports. Nodes missing from `endpoints`
    (unreachable, no device) are left out; the caller reports them."""
    tests: list[tuple[Endpoint, Endpoint]] = []
    for s, c in pairs:
        if s not in endpoints or c not in endpoints:
            continue
        by_dev_c = list(endpoints[c])
        for i, ep_s in enumerate(endpoints[s]):
            if i < len(by_dev_c):
                tests.append((ep_s, by_dev_c[i]))
    if base_port + len(tests) - 1 > 65535:
        raise UsageError(
            f"{len(tests)} pair tests from port {base_port} run past 65535",
            remedy="lower fabric.pingpong.base_port",
        )
    busy: list[set[tuple[str, str]]] = []
    out: list[PairTest] = []
    for k, (ep_s, ep_c) in enumerate(tests):
        hcas = {(ep_s.node, ep_s.device), (ep_c.node, ep_c.device)}
        r = next((i for i, used in enumerate(busy) if not used & hcas), len(busy))
        if r == len(busy):
            busy.append(set())
        busy[r] |= hcas
        out.append(PairTest(ep_s, ep_c, base_port + k, r))
    return sorted(out, key=lambda t: (t.round, t.tcp_port))


def rounds(tests: Sequence[PairTest]) -> list[list[PairTest]]:
    n = max((t.round for t in tests), default=-1) + 1
    return [[t for t in tests if t.round == r] for r in range(n)]


def rc_pingpong_argv(ep: Endpoint, flags: PairFlags, port: int, server_host: str | None = None) -> list[str]:
    """`ibv_rc_pingpong` for one side; the client adds the server's address. -g is required on RoCE."""
    argv = ["ibv_rc_pingpong", "-d", ep.device, "-i", str(ep.ib_port), "-p", str(port),
            "-s", str(flags.size), "-n", str(flags.iters), "-m", str(flags.mtu)]
    if ep.gid_index is not None:
        argv += ["-g", str(ep.gid_index)]
    if server_host:
        argv.append(server_host)
    return argv


def perftest_argv(
    tool: str, ep: Endpoint, flags: PairFlags, port: int, server_host: str | None = None
) -> list[str]:
    """`ib_write_lat` / `ib_write_bw`: same options both sides; -F so a cpufreq governor does not abort."""
    argv = [tool, "-d", ep.device, "-i", str(ep.ib_port), "-p", str(port), "-m", str(flags.mtu), "-F"]
    if tool == "ib_write_bw":
        argv += ["-s", "65536", "-n", str(max(flags.iters, 5000)), "--report_gbits"]
    else:
        argv += ["-s", "2", "-n", str(flags.iters)]
    if ep.gid_index is not None:
        argv += ["-x", str(ep.gid_index)]
    if ep.cuda_device is not None:
        argv.append(f"--use_cuda={ep.cuda_device}")
    if server_host:
        argv.append(server_host)
    return argv
