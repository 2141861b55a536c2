"""Judging one pair test (both sides' outputs and exit codes) into a finding that names both ends.

Thresholds (profile `fabric.pingpong`): ibv_rc_pingpong usec/iter is a full round trip and is held
to `max_rtt_us`; perftest write latency is half a round trip, so 2 x t_typical is held to the same
number; ib_write_bw's average must reach `min_bw_fraction` of the slower link. Within twice the
threshold (or above half the bandwidth target) a miss is a warning, beyond it a failure.

The judge reads parsed outputs only: the check parses both ends' text with infer_ctl.facts.rdma_pingpong
and passes the result in; the raw text travels in `PairRun` only to be quoted (last lines) in findings.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.fabric.facts import PairOutput, PerftestOutput, RcPingPongOutput
from infer_ctl.core.fabric.pairs import PairTest
from infer_ctl.core.findings import Finding, Status, worst

CHECK_BY_TOOL = {"ibv_rc_pingpong": "fabric.pingpong", "ib_write_lat": "fabric.write_lat", "ib_write_bw": "fabric.write_bw"}

_LIKELY = (
    "the GID index (both ends RoCE v2 and the same IPv4/IPv6 family), PFC on the RoCE priority along "
    "the whole path, the path MTU (-m) against both active MTUs, and IP routing between the GID subnets"
)


@dataclass(frozen=True)
class Thresholds:
    max_rtt_us: float = 6.0
    min_bw_fraction: float = 0.8
    #: slower of the two link rates in Gb/s, for the bandwidth target
    link_gbps: float | None = None


@dataclass
class PairRun:
    """What happened on both ends of one test."""

    test: PairTest
    tool: str
    server_ready: bool
    server_exit: int | None
    server_text: str
    client_exit: int | None
    client_text: str
    client_timed_out: bool = False
    server_timed_out: bool = False
    #: an inferctl-side failure (node unreachable mid-test, ...)
    error: str | None = None
    #: where the server address the client was given came from (core.fabric.endpoints: gid | ssh_config | profile)
    server_address_source: str | None = None


def _finding(status: Status, run: PairRun, message: str, remedy: str | None, **details: Any) -> Finding:
    t = run.test
    base = {
        "server": t.server.node, "client": t.client.node,
        "server_device": t.server.device, "client_device": t.client.device,
        "server_gid_index": t.server.gid_index, "client_gid_index": t.client.gid_index,
        "tcp_port": t.tcp_port, "round": t.round, "tool": run.tool,
        "server_address": t.server.host, "server_address_source": run.server_address_source,
    }
    return Finding.make(status, CHECK_BY_TOOL.get(run.tool, "fabric.pingpong"), t.server.node, t.label,
                        message, details={**base, **details}, remedy=remedy)


def judge_pair(run: PairRun, client: PairOutput, server: PairOutput, th: Thresholds) -> Finding:
    """`client` and `server` are both ends' outputs as parsed for `run.tool` (facts.rdma_pingpong)."""
    t = run.test
    ends = f"{t.server.node} ({t.server.device}) and {t.client.node} ({t.client.device})"
    if run.error:
        return _finding(Status.UNKNOWN, run, f"{run.tool} between {ends} could not run: {run.error}",
                        "check that both nodes are reachable (inferctl nodes) and rerun")
    if not run.server_ready:
        why = server.errors[0] if server.errors else f"exit {run.server_exit}"
        return _finding(Status.FAIL, run, f"{run.tool} server on {t.server.node} never listened on TCP {t.tcp_port}: {why}",
                        f"run `{run.tool} -d {t.server.device}` on {t.server.node} by hand; install rdma-core/perftest "
                        f"or fix the device if it does not start",
                        server_output=_tail(run.server_text))
    if isinstance(client, PerftestOutput) and isinstance(server, PerftestOutput):
        return _judge_perftest(run, client, server, th, ends)
    if not isinstance(client, RcPingPongOutput) or not isinstance(server, RcPingPongOutput):
        raise TypeError(f"{run.tool}: both ends must be parsed with the same tool's parser")
    failed = _failure(run, [*client.errors, *server.errors], client.exchanged, ends)
    if failed:
        return failed
    rtt = client.usec_per_iter if client.usec_per_iter is not None else server.usec_per_iter
    if rtt is None:
        return _finding(Status.FAIL, run, f"{run.tool} between {ends} printed no result line", None,
                        client_output=_tail(run.client_text))
    details = {"rtt_us": rtt, "one_way_us": round(rtt / 2, 3), "mbit_per_s": client.mbit_per_s,
               "local_gid": client.local_gid, "remote_gid": client.remote_gid, "server_rtt_us": server.usec_per_iter}
    return _latency(run, rtt, th, ends, details)


def _failure(run: PairRun, errors: list[str], connected: bool, ends: str) -> Finding | None:
    t = run.test
    if run.client_timed_out or run.server_timed_out:
        side = "client" if run.client_timed_out else "server"
        if not connected or "connect" in " ".join(errors).lower():
            cause = (f"the {side} hung before the QP exchange finished: is TCP port {t.tcp_port} open from "
                     f"{t.client.node} to {t.server.node} (firewall)?")
        else:
            cause = f"the RDMA connection stalled; check {_LIKELY}"
        return _finding(Status.FAIL, run, f"{run.tool} between {ends} timed out ({side})", cause,
                        errors=errors, client_output=_tail(run.client_text), server_output=_tail(run.server_text))
    if errors or run.client_exit != 0 or run.server_exit not in (0, None):
        message = _headline(errors) if errors else f"client exit {run.client_exit}, server exit {run.server_exit}"
        return _finding(Status.FAIL, run, f"{run.tool} between {ends} failed: {message}", _remedy_for(errors, run),
                        errors=errors, client_exit=run.client_exit, server_exit=run.server_exit,
                        client_output=_tail(run.client_text), server_output=_tail(run.server_text))
    return None


def _latency(run: PairRun, rtt: float, th: Thresholds, ends: str, details: dict[str, Any]) -> Finding:
    msg = f"round trip {rtt:.2f} us between {ends} (limit {th.max_rtt_us:g} us)"
    if rtt <= th.max_rtt_us:
        return _finding(Status.OK, run, msg, None, **details)
    status = Status.WARN if rtt <= 2 * th.max_rtt_us else Status.FAIL
    return _finding(status, run, msg,
                    "on an idle fabric a slow round trip points at pause storms or congestion (PFC/ECN counters), "
                    "extra switch hops, or CPU power saving on either node; rerun to rule out noise", **details)


def _judge_perftest(run: PairRun, client: PerftestOutput, server: PerftestOutput, th: Thresholds, ends: str) -> Finding:
    failed = _failure(run, [*client.errors, *server.errors], client.exchanged, ends)
    if failed:
        return failed
    if run.tool == "ib_write_bw":
        bw_rows = client.bw or server.bw
        if not bw_rows:
            return _finding(Status.FAIL, run, f"ib_write_bw between {ends} printed no result row", None,
                            client_output=_tail(run.client_text))
        gbps = bw_rows[-1].bw_average_gbps
        details = {"bw_average_gbps": round(gbps, 2), "link_gbps": th.link_gbps}
        if th.link_gbps is None:
            return _finding(Status.OK, run, f"write bandwidth {gbps:.1f} Gb/s between {ends} (link rate unknown)",
                            None, **details)
        target = th.min_bw_fraction * th.link_gbps
        msg = f"write bandwidth {gbps:.1f} Gb/s between {ends} (target {target:.0f} Gb/s)"
        if gbps >= target:
            return _finding(Status.OK, run, msg, None, **details)
        status = Status.WARN if gbps >= target / 2 else Status.FAIL
        return _finding(status, run, msg, "check the link rate on both ends, PCIe width of the HCAs, PFC pause "
                        "counters and that no other traffic shares the link", **details)
    lat_rows = client.lat or server.lat
    if not lat_rows:
        return _finding(Status.FAIL, run, f"ib_write_lat between {ends} printed no result row", None,
                        client_output=_tail(run.client_text))
    row = lat_rows[-1]
    details = {"t_typical_us": row.t_typical, "t_avg_us": row.t_avg, "p99_us": row.p99, "p999_us": row.p999,
               "rtt_us": round(2 * row.t_typical, 3)}
    return _latency(run, 2 * row.t_typical, th, ends, details)


# Work completion status numbers (rdma-core libibverbs/verbs.h, enum ibv_wc_status). perftest before
# commit c7f9e40 (2025-08) prints only the number ("Failed status 12: wr_id 0 syndrom 0x81"), later
# versions and rc_pingpong print ibv_wc_status_str() with the number in parentheses.
WC_RETRY_EXC_ERR = 12
WC_RNR_RETRY_EXC_ERR = 13
_WC_STATUS = re.compile(r"failed status[ -](?:[^(:]*\((\d+)\)|(\d+))")
# getaddrinfo() failing, as rc_pingpong ("<gai_strerror> for <host>:<port>") and perftest ("<gai_strerror> for
# ai_family: ... service: <host> port: <n>", then "Problem in resolving basic address and port") print it
_RESOLUTION = ("name or service not known", "temporary failure in name resolution", "no address associated with",
               "problem in resolving basic address")


def wc_status(errors: Sequence[str]) -> int | None:
    """The first work completion status number in a tool's error lines."""
    for line in errors:
        if m := _WC_STATUS.search(line.lower()):
            return int(m.group(1) or m.group(2))
    return None


def _remedy_for(errors: Sequence[str], run: PairRun) -> str:
    t = run.test
    port, server, client, addr = t.tcp_port, t.server.node, t.client.node, t.server.host
    text = " ".join(errors).lower()
    status = wc_status(errors)
    if any(r in text for r in _RESOLUTION):
        return (f"{client} cannot resolve {addr!r}, the address it was given for {server} (from "
                f"{run.server_address_source or 'the profile'}): the TCP exchange before the RDMA test needs a name "
                f"or address {client} can resolve. Give {server}'s RoCE netdev an IPv4 address (its RoCE v2 GID's "
                f"IPv4 is used first), or make the name resolvable on the nodes (DNS, /etc/hosts); ~/.ssh/config "
                f"aliases exist only on the controller")
    if "retry counter exceeded" in text or "retry exceeded" in text or status == WC_RETRY_EXC_ERR:
        return f"packets are not delivered on the RDMA path (transport retry counter exceeded); check {_LIKELY}"
    if status == WC_RNR_RETRY_EXC_ERR:
        return ("the receiver had no receive posted (RNR retry exceeded): both ends must run the same test with the "
                "same flags (-s, -n, -m); rerun, and check the server side's output")
    if "rtr" in text or "rts" in text:
        return "the QP could not be connected: the GID index (-g) is empty or not RoCE v2, or -m exceeds the active MTU"
    if "couldn't connect to " in text and "remote qp" not in text:
        return (f"{client} could not open TCP {addr}:{port} on {server} (refused, unreachable or filtered): the QP "
                f"numbers are exchanged over TCP with the server's data-plane address; open the TCP ports from "
                f"fabric.pingpong.base_port between the nodes (firewall) and check the route from {client} to {addr}")
    if "read remote address" in text or "client read" in text or "server read" in text:
        return f"the TCP exchange failed: open TCP port {port} between the nodes and check both sides use the same flags"
    if "ib devices" in text or "not found" in text or "did not detect" in text:
        return "the RDMA device is missing on one end; run `inferctl check fabric` without --pingpong to see which"
    return f"rerun by hand with the same flags on both ends; check {_LIKELY}"


def _headline(errors: Sequence[str]) -> str:
    """The error line to show: perftest's "Completion with error at client" says little without the
    status line that follows it."""
    if errors[0].lower().startswith("completion with error") and len(errors) > 1:
        return f"{errors[0]}: {errors[1]}"
    return errors[0]


def _tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass(frozen=True)
class MatrixCell:
    status: Status
    text: str


def pair_matrix(findings: Iterable[Finding]) -> dict[tuple[str, str], MatrixCell]:
    """(server node, client node) -> worst status over rails and tools, with the worst round trip."""
    cells: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        if f.check in CHECK_BY_TOOL.values() and "server" in f.details:
            cells.setdefault((f.details["server"], f.details["client"]), []).append(f)
    out = {}
    for key, fs in cells.items():
        status = worst(f.status for f in fs)
        rtts = [f.details["rtt_us"] for f in fs if f.details.get("rtt_us") is not None]
        text = f"{max(rtts):.2f} us" if rtts else status.value
        out[key] = MatrixCell(status, text)
    return out
