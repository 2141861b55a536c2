"""Live progress for fan-outs: a rich bar on stderr when it is a terminal, nothing otherwise.

    with fanout_progress(sess.err, len(nodes), "exec", enabled=sess.progress) as on_done:
        outcomes = fleet.map(nodes, fn, progress=on_done)

The callback is called by Fleet.map in the calling thread, once per finished node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


@contextmanager
def fanout_progress(
    console: Console, total: int, description: str, *, enabled: bool
) -> Iterator[Callable[[Any], None]]:
    """Yields a `progress=` callback for Fleet.map; a no-op when `enabled` is false (--json, pipes)."""
    if not enabled or total == 0:
        yield lambda outcome: None
        return
    failed = 0
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total, failed="")

        def on_done(outcome: Any) -> None:
            nonlocal failed
            if not getattr(outcome, "ok", True):
                failed += 1
            progress.update(task, advance=1, failed=f"[red]{failed} failed[/red]" if failed else "")

        yield on_done
