"""`show_gids` (mlnx-tools): `DEV PORT INDEX GID IPv4 VER DEV` rows, then `n_gids_found=N`.

The tool is not needed (the sysfs gatherer reads the same table); the parser lets users and tests
feed a show_gids paste to the GID chooser. Columns are TABs in real output and spaces in pastes, and
the IPv4 column is empty for non-IPv4 GIDs, so rows are parsed by shape, not by column position.
"""

from __future__ import annotations

import re

from infer_ctl.core.fabric.facts import GidEntry, ShowGidsRow

_ROW = re.compile(
    r"^(?P<dev>\S+)\s+(?P<port>\d+)\s+(?P<index>\d+)\s+(?P<gid>[0-9a-fA-F:]{39})\s+"
    r"(?:(?P<ipv4>\d+\.\d+\.\d+\.\d+)\s+)?(?P<ver>v[12])(?:\s+(?P<ndev>\S+))?\s*$"
)


def parse_show_gids(text: str) -> list[ShowGidsRow]:
    rows = []
    for line in text.splitlines():
        m = _ROW.match(line.strip())
        if not m:
            continue
        gid_type = "RoCE v2" if m.group("ver") == "v2" else "IB/RoCE v1"
        entry = GidEntry(int(m.group("index")), m.group("gid").lower(), gid_type, m.group("ndev"))
        rows.append(ShowGidsRow(m.group("dev"), int(m.group("port")), entry, m.group("ipv4")))
    return rows
