"""How `--help` reads: one placeholder style, no `<bool>` on switches, prose not broken mid-sentence, and
an example on every command (issue 29, item 8).

typer >= 0.29 prints its own type labels in the help (`<bool>` beside a switch that takes no value,
`<list[str]>`, `<int range> [x>=1024]`) and keeps the docstrings' hard line breaks in the command lists.
Rather than repeat a metavar on ~350 options, the finished click tree is polished once, here, before it
runs: a new option gets the house style without anyone remembering it.
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape
from typer.core import TyperArgument, TyperOption

try:  # typer >= 0.16 vendors its own copy of click (see cli/main.py)
    from typer._click.core import Context  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # pragma: no cover - older typer depends on click proper
    from click.core import Context  # type: ignore[assignment,unused-ignore]

from infer_ctl.cli.examples import EXAMPLES

#: the placeholder of a value by its Python type; choices print as `a|b|c`, the words a user types
_PLACEHOLDER = {"int": "N", "float": "NUM", "str": "TEXT", "path": "PATH", "Path": "PATH", "bool": "BOOL"}


class _Option(TyperOption):
    """A TyperOption whose help column says the placeholder only (ranges move into the help text)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return self.metavar

    def _get_number_range_help_str(self) -> str | None:
        return None


class _Argument(TyperArgument):
    """A TyperArgument shown as click shows one (`COMMAND...`, `[URL]`), not typer's `{command}...`."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self._rich_display_name()
        return name if self.required else f"[{name}]"


def _placeholder(param: Any) -> str:
    desc = param.type_descriptor
    if desc.is_choice and desc.choices:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices)
    if desc.is_path:
        return "PATH"
    label = param.bare_type() if not desc.is_ranged else desc.ranged_type_name
    label = re.sub(r"^list\[(.*)\]$", r"\1", label)
    return _PLACEHOLDER.get(label, label.upper())


def _range_words(param: Any) -> str | None:
    lo, hi = getattr(param, "min", None), getattr(param, "max", None)
    if lo is not None and hi is not None:
        return f"{lo} to {hi}"
    if lo is not None:
        return f"{lo} or more"
    if hi is not None:
        return f"at most {hi}"
    return None


def _option(param: TyperOption) -> None:
    param.__class__ = _Option
    if param.is_flag or param.count:
        param.metavar = ""  # a switch takes no value: no placeholder at all
        return
    if param.metavar is None:
        param.metavar = _placeholder(param) + ("..." if param.multiple else "")
    words = _range_words(param)
    if words and words not in (param.help or ""):
        param.help = f"{param.help or ''} ({words})".strip()


def _argument(param: TyperArgument) -> None:
    param.__class__ = _Argument
    if param.metavar is None:
        param.metavar = (param.name or "ARG").upper() + ("..." if param.nargs != 1 else "")


def unwrap(text: str) -> str:
    """Docstrings are wrapped at the source's width; typer keeps those breaks in the command lists, so a
    sentence broke wherever the source line did. Paragraphs (blank-line separated) stay; `\\b` paragraphs
    are verbatim by click's convention."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _examples_epilog(path: str) -> str | None:
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    # rich markup is parsed in the epilog: `[x]` in a shell line must stay literal
    return "Examples:\n" + "\n".join(f"  {escape(line)}" for line in lines)


def polish(cmd: Any, path: str = "", parent: Any = None) -> Any:
    """Apply the house help style to `cmd` and everything below it, in place; returns `cmd`."""
    # click makes the --help option on first use and caches it; made here under the same context chain
    # (so `-h` is inherited as at run time), it is styled like every other switch
    ctx = Context(cmd, parent=parent, info_name=path.rpartition(" ")[2] or "inferctl", **cmd.context_settings)
    help_option = cmd.get_help_option(ctx)
    if isinstance(help_option, TyperOption):
        _option(help_option)
    if cmd.help:
        cmd.help = unwrap(cmd.help)
    if cmd.short_help:
        cmd.short_help = unwrap(cmd.short_help)
    cmd.epilog = _examples_epilog(path) or cmd.epilog
    for param in cmd.params:
        if isinstance(param, TyperOption):
            _option(param)
        elif isinstance(param, TyperArgument):
            _argument(param)
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        polish(sub, f"{path} {name}".strip(), ctx)
    return cmd
