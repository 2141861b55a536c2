"""Outputs of the pair tests: `ibv_rc_pingpong` (rdma-core) and perftest's `ib_write_lat`/`ib_write_bw`.

Formats are the printf strings of rdma-core libibverbs/examples/rc_pingpong.c and of perftest's
src/perftest_parameters.h (RESULT_FMT_LAT/REPORT_FMT_LAT, RESULT_FMT(_G)/REPORT_FMT; versions and the
strings themselves in docs/reference/tool-output-formats.md). rc_pingpong's
usec/iter is one full round trip (ping + pong); perftest's write latency is half the round trip.
perftest rows contain tabs, so rows are split on whitespace and columns are found from the header
text (older perftest printed fewer latency columns). `--out_json` files are used only when they are
valid JSON (perftest before ~2023 wrote unquoted keys).
"""

from __future__ import annotations

import json
import re
from typing import Any

from infer_ctl.core.fabric.facts import (
    PairOutput,
    PerftestBwRow,
    PerftestLatRow,
    PerftestOutput,
    RcPingPongOutput,
)

_ADDR = re.compile(
    r"^\s*(local|remote) address:\s*LID (0x[0-9a-fA-F]+|\d+),\s*QPN (0x[0-9a-fA-F]+),\s*PSN (0x[0-9a-fA-F]+)"
    r"(?:,\s*GID (\S+))?"
)
_BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec")
_ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter")
# Both tools print "remote address: LID ..." once the TCP exchange of the QP numbers has finished.
_REMOTE = "remote address"
# Lines rdma-core examples print on failure ("Failed status ...", "Couldn't ...", "Failed to ...").
_ERROR = re.compile(r"^(Failed .*|Couldn't .*|Unable to .*|.*: No such .*|client read: .*|server read: .*|"
                    r"No IB devices found.*|Failed to get IB devices list.*|IB device \S+ not found.*|"
                    # getaddrinfo() failing in pp_client_exch_dest: "<gai_strerror> for <host>:<port>"
                    r".+ for \S+:\d+)$")


def parse_rc_pingpong(text: str) -> RcPingPongOutput:
    out = RcPingPongOutput(exchanged=_REMOTE in text)
    for raw in text.splitlines():
        line = raw.strip()
        if m := _ADDR.match(line):
            if m.group(1) == "local":
                out.local_gid = m.group(5)
            else:
                out.remote_gid = m.group(5)
        elif m := _BYTES.match(line):
            out.bytes, out.mbit_per_s = int(m.group(1)), float(m.group(3))
        elif m := _ITERS.match(line):
            out.iters, out.usec_per_iter = int(m.group(1)), float(m.group(3))
        elif _ERROR.match(line):
            out.errors.append(line)
    return out


_LAT_KEYS = ("t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p999")
_PERFTEST_ERR = re.compile(
    r"^(Couldn't .*|Unable to .*|Failed .*|Error: .*|.*Did not detect devices.*|"
    r".*check if driver is up.*|Unable to find the Infiniband/RoCE device.*|.*[Cc]ompletion with error.*|"
    # check_add_port(): "<gai_strerror> for ai_family: %x service: <host> port: %d", then the next line
    r".+ for ai_family: .*|Problem in resolving basic address and port)$"
)


def parse_perftest(text: str) -> PerftestOutput:
    out = PerftestOutput(exchanged=_REMOTE in text)
    mode: str | None = None
    unit = "MB/sec"
    lines = text.splitlines()
    for i, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            continue
        if line.endswith("Test") and i > 0 and lines[i - 1].strip().startswith("---") and out.test is None:
            out.test = line
        elif "Device" in line and ":" in line and out.device is None and (m := re.search(r"Device\s*:\s*(\S+)", line)):
            out.device = m.group(1)
        elif m := re.match(r"Link type\s*:\s*(\S+)", line):
            out.link_type = m.group(1)
        elif m := re.match(r"GID index\s*:\s*(\d+)", line):
            out.gid_index = int(m.group(1))
        elif m := re.match(r"Mtu\s*:\s*(\d+)", line):
            out.mtu = int(m.group(1))
        elif line.startswith("#bytes"):
            if "t_min" in line or "t_typical" in line:
                mode = "lat"
            elif "BW" in line:
                mode = "bw"
                u = re.search(r"BW average\[([^\]]+)\]", line)
                unit = u.group(1) if u else unit
        elif line.startswith("---"):
            mode = None if mode and (out.lat or out.bw) else mode
        elif mode and re.match(r"^\d+\s+\d+", line):
            nums = line.split()
            try:
                values = [float(v) for v in nums]
            except ValueError:
                continue
            if mode == "lat" and len(values) >= 5:
                extra = dict(zip(_LAT_KEYS[3:], values[5:9], strict=False))
                out.lat.append(PerftestLatRow(int(values[0]), int(values[1]), values[2], values[3], values[4], **extra))
            elif mode == "bw" and len(values) >= 5:
                out.bw.append(PerftestBwRow(int(values[0]), int(values[1]), values[2], values[3], values[4], unit))
        elif _PERFTEST_ERR.match(line):
            out.errors.append(line)
    return out


def parse_pair_output(tool: str, text: str) -> PairOutput:
    """One end's output of a pair test, read with the parser of the tool that ran."""
    return parse_rc_pingpong(text) if tool == "ibv_rc_pingpong" else parse_perftest(text)


def parse_perftest_json(text: str) -> PerftestOutput | None:
    """`--out_json` content, or None when it is not valid JSON (perftest#216)."""
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    info, res = doc.get("test_info") or {}, doc.get("results") or {}
    out = PerftestOutput(
        test=info.get("test"),
        device=info.get("Device"),
        link_type=info.get("Link_type"),
        gid_index=info.get("GID_index"),
        mtu=info.get("Mtu"),
    )
    if "t_typical" in res:
        out.lat.append(
            PerftestLatRow(
                int(res.get("MsgSize", 0)), int(res.get("n_iterations", 0)),
                float(res["t_min"]), float(res["t_max"]), float(res["t_typical"]),
                res.get("t_avg"), res.get("t_stdev"), res.get("percentile_99"), res.get("percentile_99.9"),
            )
        )
    if "BW_average" in res:
        out.bw.append(
            PerftestBwRow(
                int(res.get("MsgSize", 0)), int(res.get("n_iterations", 0)),
                float(res.get("BW_peak", 0.0)), float(res["BW_average"]), float(res.get("MsgRate", 0.0)),
                "Gb/sec",
            )
        )
    return out
