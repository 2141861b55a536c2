"""The PCIe link of each RDMA NIC, from sysfs: `/sys/class/infiniband/<dev>/device/` is the NIC's PCI
function, whose `current_link_width`/`max_link_width` (lanes, `%u`) and `current_link_speed`/
`max_link_speed` (kernel drivers/pci/pci-sysfs.c: pci_speed_string(), "32.0 GT/s PCIe"; before ~5.3
"8 GT/s" / "8.0 GT/s"; "Unknown" when not reported) say how the link trained. A ConnectX trained at x8
of x16, or at Gen4 in a Gen5 slot, halves what the NIC can move whatever the port rate says.

Same test seam as facts/rdma_sysfs.py: the root is `$INFERCTL_SYSFS_ROOT` on the node (default /sys).
"""

from __future__ import annotations

import re
import shlex

from infer_ctl.core.fabric.facts import NicPcie
from infer_ctl.facts.rdma_sysfs import SYSFS_ROOT_ENV
from infer_ctl.remote.base import Command

FILES = ("current_link_width", "max_link_width", "current_link_speed", "max_link_speed")

_SCRIPT = r"""
for d in "$R"/class/infiniband/*; do
  [ -d "$d/device" ] || continue
  for f in FILES; do
    v=
    IFS= read -r v < "$d/device/$f" 2>/dev/null || [ -n "$v" ] || continue
    printf '%s %s %s\n' "${d##*/}" "$f" "$v"
  done
done
exit 0
""".replace("FILES", " ".join(FILES))
_GTS = re.compile(r"^\s*([\d.]+)\s*GT/s")


def nic_pcie_command(root: str | None = None) -> Command:
    head = f"R={shlex.quote(root)}\n" if root else f'R="${{{SYSFS_ROOT_ENV}:-/sys}}"\n'
    return Command("sh", "-c", head + _SCRIPT, "inferctl-nic-pcie")


def _width(value: str | None) -> int | None:
    return int(value) if value is not None and value.strip().isdigit() else None


def _speed(value: str | None) -> float | None:
    m = _GTS.match(value or "")
    return float(m.group(1)) if m else None


def parse_nic_pcie(text: str) -> dict[str, NicPcie]:
    """`<device> <file> <value>` lines -> per RDMA device its PCIe link (fields None where unreported)."""
    raw: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in FILES:
            raw.setdefault(parts[0], {})[parts[1]] = parts[2].strip()
    return {
        dev: NicPcie(
            width=_width(v.get("current_link_width")), max_width=_width(v.get("max_link_width")),
            speed_gts=_speed(v.get("current_link_speed")), max_speed_gts=_speed(v.get("max_link_speed")),
            speed_text=v.get("current_link_speed"),
        )
        for dev, v in raw.items()
    }
