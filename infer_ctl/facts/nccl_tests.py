"""nccl-tests `all_reduce_perf`: the command and a parser of its text output.

Format strings from NVIDIA/nccl-tests src/util.cu and src/common.{cu,h} (2.x): `#  Rank %2d Group %2d Pid
%6d on %10s device %2d [%s] %s` per rank, a header naming the columns (`size count type redop root time
algbw busbw #wrong time algbw busbw #wrong`; older releases have no `root` and call the last column
`error`), one row per size, then `# Out of bounds values : %d OK|FAILED` and `# Avg bus bandwidth : %g`.
Failures print `%s: Test NCCL failure %s:%d '%s / %s'`, `%s: Test CUDA failure ...` and ` .. %s pid %d:
Test failure %s:%d`. Columns are found from the header (not fixed offsets), so both layouts parse; Open
MPI's `--tag-output` prefix (`[1,0]<stdout>:`) is stripped.
"""

from __future__ import annotations

import re

from infer_ctl.core.diag.nccl import NcclRank, NcclRow, NcclRun
from infer_ctl.remote.base import Command

_TAG = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s*(.*)$")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([\d.eE+-]+)")
_FAIL = re.compile(r"(Test NCCL failure .*|Test CUDA failure .*|Test failure .*|NCCL WARN .*|"
                   r"mpirun (?:was unable|detected that|noticed that).*|ORTE was unable.*|.*: command not found)$")


def parse_all_reduce(text: str) -> NcclRun:
    run = NcclRun()
    columns: list[str] | None = None
    for raw in text.splitlines():
        line = _TAG.sub("", raw).rstrip()
        s = line.strip()
        if not s:
            continue
        if m := _RANK.match(s):
            run.ranks.append(NcclRank(int(m.group(1)), m.group(2), int(m.group(3)), m.group(4).strip()))
        elif m := _OOB.match(s):
            run.out_of_bounds = int(m.group(1))
        elif m := _AVG.match(s):
            run.avg_busbw = float(m.group(1))
        elif s.startswith("#") and "busbw" in s and "size" in s:
            columns = s.lstrip("#").split()
        elif s.startswith("# nThread"):
            run.header = s
        elif not s.startswith("#") and columns and s[0].isdigit():
            row = _row(columns, s.split())
            if row is not None:
                run.rows.append(row)
        elif m := _FAIL.search(s):
            run.errors.append(s)
    return run


def _row(columns: list[str], cells: list[str]) -> NcclRow | None:
    if len(cells) != len(columns):
        return None
    # the first time/algbw/busbw/#wrong group is out-of-place, the second in-place
    idx: dict[str, list[int]] = {}
    for i, c in enumerate(columns):
        idx.setdefault("wrong" if c in ("#wrong", "error") else c, []).append(i)
    try:
        def num(name: str, k: int) -> float | None:
            pos = idx.get(name, [])
            return float(cells[pos[k]]) if len(pos) > k else None

        def wrong(k: int) -> int | None:
            pos = idx.get("wrong", [])
            if len(pos) <= k or cells[pos[k]] == "N/A":
                return None
            return int(float(cells[pos[k]]))

        oop_time, oop_alg, oop_bus = num("time", 0), num("algbw", 0), num("busbw", 0)
        if oop_time is None or oop_alg is None or oop_bus is None:
            return None
        return NcclRow(int(cells[idx["size"][0]]), int(cells[idx["count"][0]]), cells[idx["type"][0]],
                       cells[idx["redop"][0]] if "redop" in idx else "", oop_time, oop_alg, oop_bus, wrong(0),
                       num("time", 1), num("algbw", 1), num("busbw", 1), wrong(1))
    except (ValueError, KeyError, IndexError):
        return None


def all_reduce_argv(binary: str, *, min_bytes: str, max_bytes: str, gpus: int = 1) -> list[str]:
    """all_reduce_perf over a size sweep (factor 2), `gpus` per process (-g; 1 under mpirun)."""
    return [binary, "-b", min_bytes, "-e", max_bytes, "-f", "2", "-g", str(gpus)]


def mpirun_command(mpirun: str, hosts: list[tuple[str, int]], argv: list[str], extra: list[str],
                   timeout_s: float) -> Command:
    """mpirun on the first node of the set: -np = all slots, one rank per GPU (-H host:slots), the
    nodes' own addresses as Open MPI reaches them over SSH; bounded by the node's `timeout`."""
    slots = ",".join(f"{h}:{n}" for h, n in hosts)
    total = sum(n for _, n in hosts)
    return Command("timeout", "-k", "10", f"{int(timeout_s)}", mpirun, "--allow-run-as-root", "-np", str(total),
                   "-H", slots, "--bind-to", "none", *extra, *argv)


def single_command(argv: list[str], timeout_s: float) -> Command:
    return Command("timeout", "-k", "10", f"{int(timeout_s)}", *argv)


__all__ = ["all_reduce_argv", "mpirun_command", "parse_all_reduce", "single_command"]
