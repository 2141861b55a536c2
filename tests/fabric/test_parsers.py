"""Table-driven parser tests: every file under tests/fixtures/rdma/<tool>/ (real outputs, provenance in
PROVENANCE.md there) is parsed and summarised, and the summary must equal `<file>.expected.json`.

The expected files were written by hand-checking each summary against the fixture text (state lines,
MTUs, GID rows, PFC tables, result lines); a review re-checked every one field by field against the
raw text. `FROM-FORMAT-*` fixtures are built from the tools' own print code (mlnx-tools pretty_print of
2017 and today, iproute2 dcb with and without -N and its rt_dsfield names, mlx5 en_stats.c counter
names) because no real capture of that variant exists. Set INFERCTL_REGEN_FIXTURES=1 to rewrite them after a
deliberate parser change, then review the diff.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.facts.ibv_devinfo import devinfo_error, parse_ibv_devinfo
from infer_ctl.facts.qos import (
    parse_dcb_app_dscp,
    parse_dcb_apptrust,
    parse_dcb_pfc,
    parse_ethtool_pause,
    parse_ethtool_stats,
    parse_mlnx_qos,
    prio_pause_counters,
)
from infer_ctl.facts.rdma_link import parse_rdma_link
from infer_ctl.facts.rdma_pingpong import parse_perftest, parse_perftest_json, parse_rc_pingpong
from infer_ctl.facts.show_gids import parse_show_gids

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "rdma"


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    return obj


def _devinfo(text: str) -> Any:
    devices = parse_ibv_devinfo(text)
    err = devinfo_error(0 if devices else 255, text if devices else "", "" if devices else text)
    return {
        "error": _plain(err),
        "devices": [
            {
                "name": d.name,
                "transport": d.transport,
                "ports": {
                    str(n): {
                        "state": p.state, "phys_state": p.phys_state, "active_mtu": p.active_mtu,
                        "max_mtu": p.max_mtu, "link_layer": p.link_layer, "width": p.active_width,
                        "speed": p.active_speed, "gids": [[g.index, g.gid, g.type] for g in p.gids],
                    }
                    for n, p in d.ports.items()
                },
            }
            for d in devices
        ],
    }


def _dcb(text: str, name: str) -> Any:
    if "apptrust" in name:
        return {"trust": parse_dcb_apptrust(text)}
    if "app-show" in name:
        return {"dscp2prio": parse_dcb_app_dscp(text)}
    return {"pfc": parse_dcb_pfc(text)}


def _perftest(text: str) -> Any:
    if text.lstrip().startswith("{"):  # an --out_json file: used only when it is valid JSON
        parsed = parse_perftest_json(text)
        return {"json_valid": parsed is not None, "parsed": _plain(parsed)}
    return _plain(parse_perftest(text))


SUMMARIES = {
    "ibv_devinfo": lambda t, n: _devinfo(t),
    "ibv_rc_pingpong": lambda t, n: _plain(parse_rc_pingpong(t)),
    "perftest": lambda t, n: _perftest(t),
    "mlnx_qos": lambda t, n: _plain(parse_mlnx_qos(t)),
    "dcb": _dcb,
    "ethtool-a": lambda t, n: _plain(parse_ethtool_pause(t)),
    "ethtool-S": lambda t, n: {"stats": len(parse_ethtool_stats(t)), "prio_pause": prio_pause_counters(parse_ethtool_stats(t))},
    "rdma-link": lambda t, n: _plain(parse_rdma_link(t)),
    "show_gids": lambda t, n: _plain(parse_show_gids(t)),
}

CASES = sorted(
    p for p in ROOT.rglob("*") if p.is_file() and p.suffix in (".txt", ".json") and not p.name.endswith(".expected.json")
)


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parser_matches_expected(path: Path) -> None:
    summary = json.loads(json.dumps(SUMMARIES[path.parent.name](path.read_text(), path.name)))
    expected_path = path.with_name(path.name + ".expected.json")
    if os.environ.get("INFERCTL_REGEN_FIXTURES") == "1":
        expected_path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    assert expected_path.exists(), f"missing {expected_path.name}; run with INFERCTL_REGEN_FIXTURES=1 and review"
    assert summary == json.loads(expected_path.read_text())


def test_every_tool_directory_has_cases() -> None:
    assert {p.parent.name for p in CASES} == set(SUMMARIES)
