"""`exec` piped or redirected, as pdsh and dshbak -c users expect: one `node: line` per output line, and
nodes whose output is identical (same stdout, stderr, exit and error) printed once under their joined
names (`pf-01,pf-02: Ubuntu 22.04`), so 64 identical answers are one line and the odd node stands out.
No table, no box drawing, no line cut or wrapped. Remote text still goes through terminal_safe: a
node's escape sequences must not act on whatever later shows this file."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infer_ctl.output.terminal_text import terminal_safe


def _key(r: dict[str, Any]) -> tuple[Any, ...]:
    return (r["stdout"], r["stderr"], r["exit_code"], r["error"], r.get("remedy"))


def group_results(results: Sequence[dict[str, Any]]) -> list[tuple[list[str], dict[str, Any]]]:
    """(node names, one result) per distinct output, in the order each output was first seen."""
    groups: dict[tuple[Any, ...], tuple[list[str], dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(_key(r), ([], r))[0].append(r["node"])
    return list(groups.values())


def _lines(text: str) -> list[str]:
    return terminal_safe(text).rstrip("\n").split("\n") if text.strip("\n") else []


def write_grouped(results: Sequence[dict[str, Any]], out: Callable[[str], None], err: Callable[[str], None]) -> None:
    """Remote stdout to `out`, remote stderr to `err` (as pdsh does), each line behind its nodes' names;
    a non-zero exit or an error is one more line on `out` (a script reading the pipe sees which node
    failed), then the summary."""
    for nodes, r in group_results(results):
        who = terminal_safe(",".join(nodes), multiline=False)
        for line in _lines(r["stdout"]):
            out(f"{who}: {line}")
        for line in _lines(r["stderr"]):
            err(f"{who}: {line}")
        if r["error"]:
            out(f"{who}: error: {terminal_safe(r['error'], multiline=False)}"
                + (f" (→ {terminal_safe(r['remedy'], multiline=False)})" if r.get("remedy") else ""))
        elif r["exit_code"]:
            out(f"{who}: exit {r['exit_code']}")
    bad = sum(not r["ok"] for r in results)
    out(f"{len(results) - bad}/{len(results)} ok" + (f", {bad} failed or unreachable" if bad else ""))
