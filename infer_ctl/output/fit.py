"""Every table printed on stdout goes through here (a render hook of the stdout console, output/console.py):

- piped or redirected, a table is plain text: columns two spaces apart, no box drawing, no line wrapped
  at a pretend width, no trailing blanks, so `grep`, `awk` and `sort` see one row per line (a table with
  a multi-line cell becomes `key: value` blocks, one line per value line);
- on a terminal too narrow for the table's natural width, it is folded to `key: value` blocks (one per
  row) instead of rich squeezing columns until headers split mid-word ("ste / ps") or vanish;
- otherwise rich draws it as its command built it.

Tables inside other renderables are left alone: those renderables choose their own narrow layout
(output/table.py FindingsView)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

_NUMERIC = re.compile(r"^$|^[-+~<>≈]?[0-9.,]+(\s?[%xX]|\s?[kKMGT]?i?B(/s)?|\s?s)?$")


def _plain(console: Console, cell: Any) -> Text:
    """A cell as styled text: markup strings parsed as rich would, other renderables rendered wide."""
    if isinstance(cell, Text):
        return cell
    if isinstance(cell, str):
        return console.render_str(cell)
    lines = console.render_lines(cell, console.options.update(width=10_000), pad=False)
    texts = [Text.assemble(*((s.text, s.style or "") for s in line)) for line in lines]
    for text in texts:
        text.rstrip()
    return Text("\n").join(texts)


def _columns(console: Console, table: Table) -> tuple[list[str], list[list[Text]]]:
    headers = [str(c.header) if not isinstance(c.header, Text) else c.header.plain for c in table.columns]
    cells = [[_plain(console, cell) for cell in col.cells] for col in table.columns]
    rows = [list(r) for r in zip(*cells, strict=True)] if cells else []
    return headers, rows


def _title(table: Table) -> list[Text]:
    if not table.title:
        return []
    title = table.title if isinstance(table.title, Text) else Text.from_markup(str(table.title))
    title = title.copy()
    title.stylize("bold")
    return [title]


def _aligned(table: Table, headers: Sequence[str], rows: Sequence[Sequence[Text]]) -> list[Text]:
    show_header = table.show_header and any(headers)
    widths = [max([len(h) if show_header else 0, *(c.cell_len for c in col)]) for col, h in
              zip(zip(*rows, strict=True) if rows else [[] for _ in headers], headers, strict=True)]
    # a right-justified column stays so only while every cell is a number: a long word in a column of
    # numbers ("no (needs ...)") would push all of them far right in plain text
    rights = [c.justify == "right" and all(_NUMERIC.match(r[i].plain) for r in rows)
              for i, c in enumerate(table.columns)]
    out: list[Text] = []
    if show_header:
        out.append(Text("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(), "bold"))
    for row in rows:
        line = Text()
        for i, (cell, w) in enumerate(zip(row, widths, strict=True)):
            if i:
                line.append("  ")
            right = rights[i]
            pad = " " * (w - cell.cell_len)
            line.append_text(Text(pad) + cell if right else cell + Text(pad))
        line.rstrip()
        out.append(line)
    return out


def _key_values(headers: Sequence[str], rows: Sequence[Sequence[Text]]) -> list[Text]:
    """One block per row: `header: value`, the first cell (the row's name) on its own line in bold."""
    keys = [h or f"column {i + 1}" for i, h in enumerate(headers)]
    width = max(map(len, keys), default=0)
    out: list[Text] = []
    for n, row in enumerate(rows):
        if n:
            out.append(Text(""))
        for i, (key, cell) in enumerate(zip(keys, row, strict=True)):
            lines = cell.split("\n") if cell.plain else [cell]
            for j, line in enumerate(lines):
                label = f"{key}:".ljust(width + 1) if j == 0 else " " * (width + 1)
                kv = Text.assemble((label, "bold" if i == 0 else "dim"), " ", line)
                kv.rstrip()
                out.append(kv)
    return out


def _row_grids(headers: Sequence[str], rows: Sequence[Sequence[Text]]) -> list[Table | Text]:
    out: list[Table | Text] = []
    for n, row in enumerate(rows):
        if n:
            out.append(Text(""))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(overflow="fold")
        for i, (key, cell) in enumerate(zip(headers, row, strict=True)):
            grid.add_row(Text(f"{key or f'column {i + 1}'}:", "bold" if i == 0 else "dim"), cell)
        out.append(grid)
    return out


class Fitted:
    """A table rendered for where it goes (see the module docstring)."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        table = self.table
        piped = not console.is_terminal
        # measured unbounded: rich caps a measurement at the width it is given, which always "fits"
        if not piped and Measurement.get(console, options.update_width(1_000_000), table).maximum <= options.max_width:
            yield table
            return
        headers, rows = _columns(console, table)
        if not piped:  # a terminal too narrow: one grid per row, a long value wraps under itself
            yield from _title(table)
            yield from _row_grids(headers, rows)
            return
        multiline = any("\n" in c.plain for row in rows for c in row)
        body = _key_values(headers, rows) if multiline else _aligned(table, headers, rows)
        for line in [*_title(table), *body]:
            line.no_wrap, line.overflow = True, "ignore"
            yield line
        if table.caption:
            yield Text.from_markup(str(table.caption)) if isinstance(table.caption, str) else table.caption


class FitTables(RenderHook):
    """The stdout console's hook: every top-level table is printed through Fitted."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [Fitted(r) if isinstance(r, Table) else r for r in renderables]

