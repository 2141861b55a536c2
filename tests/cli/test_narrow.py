"""At 80 columns a table too wide folds to `key: value` blocks: no header split mid-word ("ste / ps",
"spec (windo / w)"), no column cut to "disaggr…" or dropped."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from infer_ctl.cli.router_cmd import _workers_table
from infer_ctl.output.fit import FitTables

WORKER = {"url": "http://127.0.0.11:30000", "role": "prefill", "healthy": True, "circuit_breaker": "closed",
          "inflight": 3, "requests": 1200, "errors": 0, "restarts": 0, "index": "exact"}
SPEC = {"decodes": [{"url": WORKER["url"], "num_steps": 3, "adaptive": False,
                     "window": {"alpha": 0.71, "accept_length": 2.9, "accept_rate": 0.64, "requests": 40}}]}


def terminal(width: int) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=True, color_system=None, highlight=False)
    console.push_render_hook(FitTables())
    return console, buf


def test_router_workers_at_80_columns_folds_without_splitting_words() -> None:
    console, buf = terminal(80)
    console.print(_workers_table([WORKER], SPEC))
    lines = [line.rstrip() for line in buf.getvalue().split("\n")]
    spec = lines[next(i for i, line in enumerate(lines) if line.startswith("spec (window):")):]
    assert " ".join(" ".join(spec).split()) == "spec (window): alpha 0.71, accept length 2.90, accept rate 0.64, 40 reqs, 3 steps"
    assert any(line.startswith("worker:") and line.endswith(WORKER["url"]) for line in lines)
    assert all(len(line) <= 80 for line in lines)
    assert not any(h in buf.getvalue() for h in ("windo\n", "ste\n"))


def test_a_table_that_fits_is_drawn_as_built() -> None:
    console, buf = terminal(160)
    console.print(_workers_table([WORKER], SPEC))
    assert "spec (window)" in buf.getvalue().split("\n")[1]
    assert "worker:" not in buf.getvalue()


def test_no_column_is_dropped_at_80_columns() -> None:
    cols = ["instance", "process", "health", "model", "disaggregation_mode", "speculative_algorithm",
            "accept_length", "cache_hit_rate"]
    table = Table(*cols)
    table.add_row("pf-01-prefill", "running", "ok", "llama", "prefill", "EAGLE3", "2.90", "0.41")
    console, buf = terminal(80)
    console.print(table)
    out = buf.getvalue()
    assert all(f"{c}:" in out for c in cols)
    assert "…" not in out
