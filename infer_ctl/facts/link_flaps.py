"""The node's link state changes: a command reading them from the journal (kernel + systemd-networkd,
filtered on the node) and their parser (formats and rule in core/fabric/link_flaps.py).

journalctl's `-o short-iso` stamps carry the zone; classic syslog stamps (`Aug 17 06:18:06`, the
azurehpc capture) have no year: the year of the reading is taken, or the one before when that would put
the event in the future. dmesg (no journal) prints seconds since boot: converted with the boot time."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from infer_ctl.core.fabric.link_flaps import LinkEvent, LinkLog
from infer_ctl.remote.base import Command

#: what the node-side filter keeps (and the parser reads)
_NETWORKD = re.compile(r"systemd-networkd\[\d+\]:\s+(?P<link>[\w.:-]+): (?P<what>[Ll]ost carrier|Gained carrier)")
_MLX5_PORT = re.compile(r"mlx5_core \S+ (?P<link>mlx5_\d+): Port: (?P<port>\d+) Link (?P<what>DOWN|ACTIVE|INIT|ARM)")
_NETDEV = re.compile(r"(?:mlx5_core \S+ )?(?P<link>[\w.-]+): Link (?P<what>down|up)\b")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z))\s")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2}\s+\d{1,2}\s\d\d:\d\d:\d\d)\s")
_DMESG = re.compile(r"^\[\s*(\d+\.\d+)\]\s")
GREP = r"lost carrier|Lost carrier|Gained carrier|Port: [0-9]+ Link (DOWN|ACTIVE|INIT|ARM)|: Link (down|up)"

SCRIPT = r"""
hours=$1
date +%s
if command -v journalctl >/dev/null 2>&1; then
  out=$(journalctl --no-pager -o short-iso --since "-${hours}h" _TRANSPORT=kernel + SYSLOG_IDENTIFIER=systemd-networkd 2>&1)
  rc=$?
  case "$out" in *"No journal files"*|*"ermission denied"*|*"not seeing messages"*) rc=1;; esac
  if [ $rc -eq 0 ]; then echo "SOURCE journal"; printf '%s\n' "$out" | grep -E "$2" | tail -n 5000; exit 0; fi
fi
if out=$(dmesg 2>&1); then
  echo "SOURCE dmesg $(awk '/^btime/ {print $2}' /proc/stat)"; printf '%s\n' "$out" | grep -E "$2" | tail -n 5000; exit 0
fi
echo "UNREADABLE ${out%%
*}"
"""


def flaps_command(window_h: float) -> Command:
    return Command("sh", "-c", SCRIPT, "inferctl-link-flaps", f"{max(1, int(window_h + 0.999))}", GREP)


def event_time(line: str, now: float, boot_time: float | None = None) -> float | None:
    if m := _ISO.match(line):
        stamp = m.group(1).replace(",", ".")
        if re.search(r"[+-]\d{4}$", stamp):
            stamp = stamp[:-2] + ":" + stamp[-2:]
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    if m := _SYSLOG.match(line):
        ref = datetime.fromtimestamp(now)
        try:
            t = datetime.strptime(f"{ref.year} {m.group(1)}", "%Y %b %d %H:%M:%S")
        except ValueError:
            return None
        if t > ref + timedelta(days=1):
            t = t.replace(year=ref.year - 1)
        return t.timestamp()
    if (m := _DMESG.match(line)) and boot_time is not None:
        return boot_time + float(m.group(1))
    return None


def parse_events(text: str, now: float, boot_time: float | None = None) -> list[LinkEvent]:
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if m := _NETWORKD.search(line):
            state = "down" if m.group("what").lower() == "lost carrier" else "up"
            link = m.group("link")
        elif m := _MLX5_PORT.search(line):
            state = "down" if m.group("what") == "DOWN" else ("up" if m.group("what") == "ACTIVE" else "init")
            link = f"{m.group('link')}/{m.group('port')}"
        elif m := _NETDEV.search(line):
            state, link = m.group("what"), m.group("link")
        else:
            continue
        out.append(LinkEvent(link, state, event_time(line, now, boot_time), line))
    return out


def parse_flaps_output(text: str, window_h: float) -> LinkLog:
    lines = text.splitlines()
    try:
        read_at = float(lines[0].strip())
    except (IndexError, ValueError):
        return LinkLog([], error="the link-state reader printed nothing", window_h=window_h)
    head = lines[1] if len(lines) > 1 else ""
    if head.startswith("UNREADABLE"):
        return LinkLog([], error=f"neither the journal nor dmesg is readable ({head[10:].strip() or 'no reason'})",
                       window_h=window_h, read_at=read_at)
    boot = None
    if head.startswith("SOURCE dmesg"):
        parts = head.split()
        boot = float(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
    return LinkLog(parse_events("\n".join(lines[2:]), read_at, boot), window_h=window_h, read_at=read_at)
