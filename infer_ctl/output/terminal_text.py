"""Remote text made inert before it reaches the operator's terminal in a table view.

Node output (hostnames, command output, tool messages quoted in findings) is attacker-controllable on a
compromised or misconfigured node. Printed as is, control sequences act on the operator's terminal:
`ESC[2J` clears it, OSC 52 (`ESC]52;c;BASE64 BEL`) writes the clipboard, `\\r` overwrites what a line
showed, U+202E reorders it ("Trojan Source", CVE-2021-42574). rich strips only BEL, BS, VT, FF and CR
(rich.control.strip_control_codes), not ESC, C1 or bidi controls.

`terminal_safe` replaces every such character with a visible escape (`\\x1b`, `\\r`, `\\x9b`, `\\u202e`):
the sequence that follows an ESC is then plain printable text, so nothing needs to be parsed, and the
operator sees what the node sent. JSON output is not touched: it keeps the exact text.
"""

from __future__ import annotations

import re

from rich.text import Text

# C0 controls except TAB and LF (handled below), DEL, C1 controls (U+0080-U+009F: 8-bit CSI/OSC/ST),
# the bidi embeddings/overrides/isolates and marks (Unicode TR9), and the line/paragraph separators.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NAMED = {"\r": "\\r", "\n": "\\n", "\x1b": "\\x1b"}


def _visible(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, multiline: bool = True) -> str:
    """`text` with every control character a terminal would act on shown as an escape. Tabs stay; line
    breaks stay where the cell may span lines (`multiline`), and a CRLF line end counts as one."""
    if multiline:
        text = text.replace("\r\n", "\n")
        return _UNSAFE.sub(lambda m: _visible(m.group()), text)
    return _UNSAFE.sub(lambda m: _visible(m.group()), text.replace("\n", "\\n"))


def safe_cell(text: str | None, *, multiline: bool = True, style: str = "") -> Text:
    """A table cell of remote text: made `terminal_safe`, and a Text, so `[...]` in it is never read as
    rich markup."""
    return Text(terminal_safe(text or "", multiline=multiline), style=style)
