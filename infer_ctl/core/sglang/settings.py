"""The settings a command line gives SGLang, flag by flag: what drift checks compare.

`command_settings` reads server arguments (the words after `-m sglang.launch_server`) the way argparse
does: canonical flag names (so `--tp 4` and `--tp-size 4` are the same setting), the last occurrence
wins, `--flag=value` and `--flag value` alike, a switch is "True" (its `--no-` form "False"), and the
values of a flag taking several (`--cuda-graph-bs 1 2 4`) stay together.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infer_ctl.core.sglang.argv import parse_extra_args
from infer_ctl.core.sglang.flags import flag_table


def dest(flag: str) -> str:
    """The ServerArgs field (and /server_info key) of a canonical flag: `--tp-size` -> `tp_size`."""
    return flag.lstrip("-").replace("-", "_")


def command_settings(args: list[str]) -> dict[str, str]:
    """Canonical flag -> value text, for the server arguments `args`."""
    table = flag_table()
    out: dict[str, str] = {}
    last: str | None = None
    values: dict[str, list[str]] = {}
    for opt in parse_extra_args(args):
        if not opt.flag.startswith("-"):
            if last is not None:  # a further value of a flag taking several
                values[last].append(opt.flag)
                out[last] = " ".join(values[last])
            continue
        spec = table.lookup(opt.flag)
        canonical = spec.canonical if spec else opt.flag
        if opt.value is None:
            negated = spec is not None and opt.flag.startswith("--no-") and opt.flag != spec.canonical
            values[canonical] = ["False" if negated else "True"]
        else:
            values[canonical] = [opt.value]
        out[canonical] = " ".join(values[canonical])
        last = canonical
    return out


def canonical_value(key: str, value: Any) -> str:
    """One spelling for a setting's value, whether it comes from a command line (text) or from
    /server_info (SGLang's resolved ServerArgs: ints, floats, booleans, lists, JSON held as text), with
    SGLang 0.5.23's own rewrites applied: an algorithm's case and its NEXTN alias (EAGLE), mooncake_tcp
    (mooncake + MC_FORCE_TCP), a deduplicated HCA list."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return " ".join(canonical_value(key, v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    text = str(value)
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return json.dumps(json.loads(stripped), sort_keys=True, separators=(",", ":"))
        except ValueError:
            return text
    if key == "speculative_algorithm":
        text = text.upper()
        return "EAGLE" if text == "NEXTN" else text
    if key == "disaggregation_transfer_backend" and text == "mooncake_tcp":
        return "mooncake"
    if key == "disaggregation_ib_device":
        return ",".join(dict.fromkeys(d.strip() for d in text.split(",") if d.strip()))
    try:
        number = float(text)
    except ValueError:
        return text
    if number.is_integer() and text.lstrip("-").isdigit():
        return str(int(number))
    return text
