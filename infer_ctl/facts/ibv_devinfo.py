"""`ibv_devinfo -v` (rdma-core libibverbs/examples/devinfo.c): ports, MTUs, speeds and the GID table.

sysfs has no active MTU, so this is where `active_mtu` comes from. The same parser reads the plain
(non-verbose) output. Failure shapes: exit 255 with "Failed to get IB devices list: ..." or
"No IB devices found"; exit 127 when rdma-core's ibverbs-utils is not installed.
"""

from __future__ import annotations

import re

from infer_ctl.core.fabric.facts import DevinfoDevice, DevinfoError, DevinfoPort, GidEntry
from infer_ctl.remote.base import Command

IBV_DEVINFO_V = Command("ibv_devinfo", "-v")

_HCA = re.compile(r"^hca_id:\s*(\S+)")
_PORT = re.compile(r"^\s+port:\s*(\d+)\s*$")
_KV = re.compile(r"^\s+([A-Za-z_][A-Za-z_ ]*?):\s+(.*?)\s*$")
_GID = re.compile(r"^\s+GID\[\s*(\d+)\]:\s+(\S+?)(?:,\s*(.+?))?\s*$")
_PAREN = re.compile(r"^(.*?)\s*\((-?\d+)\)$")


def _value(text: str) -> str:
    m = _PAREN.match(text)
    return m.group(1).strip() if m else text.strip()


def _mtu(text: str) -> int | None:
    try:
        return int(_value(text))
    except ValueError:
        return None


def parse_ibv_devinfo(text: str) -> list[DevinfoDevice]:
    devices: list[DevinfoDevice] = []
    dev: DevinfoDevice | None = None
    port: DevinfoPort | None = None
    for line in text.splitlines():
        if m := _HCA.match(line):
            dev = DevinfoDevice(m.group(1))
            devices.append(dev)
            port = None
            continue
        if dev is None:
            continue
        if m := _PORT.match(line):
            port = DevinfoPort(int(m.group(1)))
            dev.ports[port.port] = port
            continue
        if port is not None and (m := _GID.match(line)):
            port.gids.append(GidEntry(int(m.group(1)), m.group(2), m.group(3)))
            continue
        m = _KV.match(line)
        if not m:
            continue
        key, value = m.group(1).strip(), m.group(2)
        if port is None:
            if key == "transport":
                dev.transport = _value(value)
            elif key == "fw_ver":
                dev.fw_ver = value
            elif key == "vendor_part_id":
                dev.vendor_part_id = value
            continue
        if key == "state":
            port.state = _value(value)
        elif key == "max_mtu":
            port.max_mtu = _mtu(value)
        elif key == "active_mtu":
            port.active_mtu = _mtu(value)
        elif key == "link_layer":
            port.link_layer = value
        elif key == "active_width":
            port.active_width = _value(value)
        elif key == "active_speed":
            port.active_speed = _value(value)
        elif key == "phys_state":
            port.phys_state = _value(value)
    return devices


def devinfo_error(exit_code: int | None, stdout: str, stderr: str) -> DevinfoError | None:
    """None when the output is a device list; otherwise what went wrong."""
    text = f"{stderr}\n{stdout}".strip()
    if exit_code == 127 or ("not found" in text and "ibv_devinfo" in text):
        return DevinfoError("not-installed", "ibv_devinfo is not installed (rdma-core ibverbs-utils)")
    if "Failed to get IB devices list" in text or "No IB devices found" in text:
        line = next(
            (ln.strip() for ln in text.splitlines() if "IB devices" in ln), "no RDMA devices"
        )
        return DevinfoError("no-devices", f"ibv_devinfo: {line}")
    if exit_code == 0 and _HCA.search(stdout) is None and not stdout.strip():
        return DevinfoError("no-devices", "ibv_devinfo printed no device")
    if exit_code not in (0, None) and not any(_HCA.match(ln) for ln in stdout.splitlines()):
        first = text.splitlines()[0] if text else f"exit {exit_code}"
        return DevinfoError("failed", f"ibv_devinfo failed (exit {exit_code}): {first}")
    if exit_code is None:
        return DevinfoError("failed", "ibv_devinfo timed out")
    return None
