"""`rdma link show` (iproute2 rdma/): port state and the netdev behind each HCA port.

Used when sysfs is not readable (e.g. a container without /sys/class/infiniband). Reads the current
JSON (`{"ifname":"mlx5_0","port":1,...,"netdev":"p1p1"}`), the old JSON (`"ifname":"mlx5_0/1"`), and
both text formats (`link mlx5_0/1 state ...` and `4/1: mlx5_3/1: state ...`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from infer_ctl.core.fabric.facts import RdmaLink
from infer_ctl.remote.base import Command

RDMA_LINK_JSON = Command("rdma", "-j", "link", "show")

_TEXT = re.compile(r"^(?:link\s+|\d+/\d+:\s+)(\S+?)/(\d+):?\s+(.*)$")


def parse_rdma_link(text: str) -> list[RdmaLink]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        doc: Any = json.loads(text)
        return [_from_json(item) for item in doc if isinstance(item, dict)]
    links = []
    for line in text.splitlines():
        m = _TEXT.match(line.strip())
        if not m:
            continue
        words = m.group(3).split()
        attrs = dict(zip(words[::2], words[1::2], strict=False))
        links.append(
            RdmaLink(m.group(1), int(m.group(2)), attrs.get("state"), attrs.get("physical_state"), attrs.get("netdev"))
        )
    return links


def _from_json(item: dict[str, Any]) -> RdmaLink:
    name = str(item.get("ifname", ""))
    port = item.get("port")
    if "/" in name:
        name, _, p = name.partition("/")
        port = int(p)
    return RdmaLink(name, int(port or 1), item.get("state"), item.get("physical_state"), item.get("netdev"))
