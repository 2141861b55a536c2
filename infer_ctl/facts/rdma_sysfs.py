"""RDMA devices, ports, GID tables, counters and the netdev QoS/ECN files, read from sysfs in one go.

One shell script walks `/sys/class/infiniband` (kernel `drivers/infiniband/core/sysfs.c`) and the
netdevs behind the HCAs and prints `relative/path=value` lines; `parse_sysfs_dump` turns them into
dataclasses. Reading with the shell builtin `read` (not `cat`) keeps a 255-entry GID table to zero
forks; empty GID slots return EINVAL on read and are simply absent from the dump.

Test seam: the sysfs root is `$INFERCTL_SYSFS_ROOT` on the node (default `/sys`), or the `root`
argument of `sysfs_command`, so tests point the gatherer at a directory tree built by the test.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping

from infer_ctl.core.fabric.facts import GidEntry, NetdevSysfs, RdmaDevice, RdmaPort, SysfsSnapshot
from infer_ctl.remote.base import Command

SYSFS_ROOT_ENV = "INFERCTL_SYSFS_ROOT"


def sysfs_root_for(node: str) -> str | None:
    """The sysfs root to read on `node` (test seam shared by `check fabric` and launch's GID probe):
    `$INFERCTL_SYSFS_ROOT` on the controller, `{node}` replaced by the node name; None: the node's
    own default (its `$INFERCTL_SYSFS_ROOT`, else /sys)."""
    template = os.environ.get(SYSFS_ROOT_ENV)
    return template.replace("{node}", node) if template else None

# Tools whose presence decides which facts can be gathered (and what the remedy says).
TOOLS = ("ibv_devinfo", "rdma", "mlnx_qos", "dcb", "ethtool", "ibv_rc_pingpong", "ib_write_lat", "ib_write_bw")

_EMIT = r"""
emit() {
  for f in "$@"; do
    [ -f "$f" ] || continue
    v=
    IFS= read -r v < "$f" 2>/dev/null || [ -n "$v" ] || continue
    printf '%s=%s\n' "${f#"$R"/}" "$v"
  done
}
"""

_DEVICES = r"""
IB="$R/class/infiniband"
if [ -d "$IB" ]; then echo "@ib present"; else echo "@ib absent"; fi
nets=""
for d in "$IB"/*; do
  [ -d "$d" ] || continue
  echo "@device ${d##*/}"
  emit "$d/node_type" "$d/fw_ver" "$d/hca_type" "$d/board_id"
  for n in "$d"/device/net/*; do
    [ -e "$n" ] || continue
    printf '%s=%s\n' "${d#"$R"/}/netdev" "${n##*/}"
    nets="$nets ${n##*/}"
  done
  for p in "$d"/ports/*; do
    [ -d "$p" ] || continue
    emit "$p/state" "$p/phys_state" "$p/rate" "$p/link_layer"
    emit "$p"/gids/* "$p"/gid_attrs/types/* "$p"/gid_attrs/ndevs/*
    emit "$p"/counters/* "$p"/hw_counters/*
  done
done
for i in $nets "$@"; do
  nd="$R/class/net/$i"
  [ -d "$nd" ] || { echo "@netdev-missing $i"; continue; }
  echo "@netdev $i"
  emit "$nd/mtu" "$nd/operstate" "$nd/qos/trust"
  emit "$nd"/ecn/roce_np/enable/* "$nd"/ecn/roce_rp/enable/*
  emit "$nd/ecn/roce_np/cnp_dscp" "$nd/ecn/roce_np/cnp_802p_prio" "$nd/ecn/roce_np/min_time_between_cnps"
done
for t in TOOLS; do
  p=$(command -v "$t" 2>/dev/null) && echo "@tool $t $p"
done
exit 0
""".replace("TOOLS", " ".join(TOOLS))

_COUNTERS = r"""
for p in "$R"/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  emit "$p"/counters/* "$p"/hw_counters/*
done
exit 0
"""


def _root_line(root: str | None) -> str:
    if root:
        return f"R={shlex.quote(root)}\n"
    return f'R="${{{SYSFS_ROOT_ENV}:-/sys}}"\n'


def sysfs_command(netdevs: Iterable[str] = (), root: str | None = None) -> Command:
    """The gatherer: devices, ports, GIDs, counters; then the listed netdevs plus those found."""
    script = _root_line(root) + _EMIT + _DEVICES
    return Command("sh", "-c", script, "inferctl-rdma-sysfs", *netdevs)


def counters_command(root: str | None = None) -> Command:
    """Only the counters, for the second sample of the delta."""
    return Command("sh", "-c", _root_line(root) + _EMIT + _COUNTERS, "inferctl-rdma-counters")


_NUM_PREFIX = re.compile(r"^\s*\d+:\s*(.+?)\s*$")
_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")
_PORT_PATH = re.compile(r"^class/infiniband/([^/]+)/ports/(\d+)/(.+)$")
_DEV_PATH = re.compile(r"^class/infiniband/([^/]+)/([^/]+)$")
_NET_PATH = re.compile(r"^class/net/([^/]+)/(.+)$")
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def _strip_num(value: str) -> str:
    m = _NUM_PREFIX.match(value)
    return m.group(1) if m else value.strip()


def _int(value: str) -> int | None:
    try:
        return int(value.strip(), 0)
    except ValueError:
        return None


def parse_rate(text: str) -> float | None:
    m = _RATE.match(text)
    return float(m.group(1)) if m else None


def parse_sysfs_dump(text: str) -> SysfsSnapshot:
    snap = SysfsSnapshot()
    gid_parts: dict[tuple[str, int, int], dict[str, str]] = {}
    for line in text.splitlines():
        if line.startswith("@"):
            word, _, rest = line[1:].partition(" ")
            if word == "ib":
                snap.ib_present = rest.strip() == "present"
            elif word == "device":
                snap.devices.setdefault(rest.strip(), RdmaDevice(rest.strip()))
            elif word == "netdev":
                snap.netdevs.setdefault(rest.strip(), NetdevSysfs(rest.strip()))
            elif word == "netdev-missing":
                if rest.strip() not in snap.missing_netdevs:
                    snap.missing_netdevs.append(rest.strip())
            elif word == "tool":
                name, _, path = rest.partition(" ")
                snap.tools[name] = path.strip()
            continue
        path, sep, value = line.partition("=")
        if not sep:
            continue
        _apply(snap, gid_parts, path, value)
    for (dev, port, index), parts in sorted(gid_parts.items()):
        gid = parts.get("gid")
        if not gid or gid == ZERO_GID:
            continue
        p = _port(snap, dev, port)
        p.gids.append(GidEntry(index, gid, parts.get("type"), parts.get("ndev") or None))
    return snap


def _port(snap: SysfsSnapshot, dev: str, port: int) -> RdmaPort:
    device = snap.devices.setdefault(dev, RdmaDevice(dev))
    return device.ports.setdefault(port, RdmaPort(dev, port))


def _apply(snap: SysfsSnapshot, gid_parts: dict[tuple[str, int, int], dict[str, str]], path: str, value: str) -> None:
    if m := _PORT_PATH.match(path):
        dev, port, rest = m.group(1), int(m.group(2)), m.group(3)
        p = _port(snap, dev, port)
        if rest == "state":
            p.state = _strip_num(value)
        elif rest == "phys_state":
            p.phys_state = _strip_num(value)
        elif rest == "rate":
            p.rate_text = value.strip()
            p.rate_gbps = parse_rate(value)
        elif rest == "link_layer":
            p.link_layer = value.strip()
        elif rest.startswith(("gids/", "gid_attrs/types/", "gid_attrs/ndevs/")):
            kind = {"gids": "gid", "types": "type", "ndevs": "ndev"}[rest.split("/")[-2]]
            index = _int(rest.rsplit("/", 1)[1])
            if index is not None:
                gid_parts.setdefault((dev, port, index), {})[kind] = value.strip()
        elif rest.startswith(("counters/", "hw_counters/")):
            n = _int(value)
            if n is not None:
                p.counters[rest.split("/", 1)[1]] = n
        return
    if m := _DEV_PATH.match(path):
        device = snap.devices.setdefault(m.group(1), RdmaDevice(m.group(1)))
        key = m.group(2)
        if key == "netdev" and value.strip() not in device.netdevs:
            device.netdevs.append(value.strip())
        elif key == "fw_ver":
            device.fw_ver = value.strip()
        elif key == "hca_type":
            device.hca_type = value.strip()
        return
    if m := _NET_PATH.match(path):
        nd = snap.netdevs.setdefault(m.group(1), NetdevSysfs(m.group(1)))
        rest = m.group(2)
        if rest == "mtu":
            nd.mtu = _int(value)
        elif rest == "operstate":
            nd.operstate = value.strip()
        elif rest == "qos/trust":
            nd.trust = value.strip().lower() or None
        elif rest.startswith(("ecn/roce_np/enable/", "ecn/roce_rp/enable/")):
            prio = _int(rest.rsplit("/", 1)[1])
            flag = _int(value)
            if prio is not None and flag is not None:
                (nd.ecn_np if "roce_np" in rest else nd.ecn_rp)[prio] = bool(flag)
        elif rest == "ecn/roce_np/cnp_dscp":
            nd.cnp_dscp = _int(value)
        elif rest == "ecn/roce_np/cnp_802p_prio":
            nd.cnp_802p_prio = _int(value)


def parse_counters_dump(text: str) -> dict[str, dict[str, int]]:
    """`{"mlx5_0/1": {"link_downed": 0, ...}}` from the counters-only script."""
    snap = parse_sysfs_dump(text)
    return {p.key: dict(p.counters) for d in snap.devices.values() for p in d.ports.values()}


def counter_deltas(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, int]]:
    """Per port, counters that grew between two samples (a counter reset reads as no growth)."""
    out: dict[str, dict[str, int]] = {}
    for port, values in after.items():
        prev = before.get(port, {})
        grown = {k: v - prev[k] for k, v in values.items() if k in prev and v > prev[k]}
        out[port] = grown
    return out
