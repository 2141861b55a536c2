"""The prefill x decode matrix of the pair tests (`pairs` in `check fabric --json`, the table after the
findings): every selected (server, client) pair, in profile order, one cell each. A pair that did not run
(a node unreachable, no usable device) is a "not run" cell with the reason, never a missing one: an
empty cell reads as "fine" at a glance."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infer_ctl.core.fabric.judge import MatrixCell


def pair_summary(
    mode: str,
    tools: Sequence[str],
    names: Sequence[str],
    pairs: Sequence[tuple[str, str]],
    matrix: Mapping[tuple[str, str], MatrixCell],
    why_not: Mapping[str, str],
) -> dict[str, Any]:
    """`matrix`: judge.pair_matrix of the findings; `why_not`: node -> why it could not take part."""
    cells = []
    for server, client in pairs:
        cell = matrix.get((server, client))
        if cell is not None:
            cells.append({"server": server, "client": client, "status": cell.status.value, "text": cell.text})
            continue
        reason = "; ".join(why_not[n] for n in (server, client) if n in why_not) or "no test ran for this pair"
        cells.append({"server": server, "client": client, "status": "unknown", "text": "not run", "reason": reason})
    order = {n: i for i, n in enumerate(names)}
    return {
        "mode": mode,
        "tools": list(tools),
        "rows": sorted({p[0] for p in pairs}, key=lambda n: order.get(n, len(order))),
        "columns": sorted({p[1] for p in pairs}, key=lambda n: order.get(n, len(order))),
        "cells": cells,
    }
