"""Driver version comparison for the driver report (the probes and their parsers: facts/gpu_driver.py).

inferctl never installs drivers: a wrong driver is MANUAL with instructions. An installed driver package
newer than the loaded module means a reboot is pending.
"""

from __future__ import annotations

import re


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))
