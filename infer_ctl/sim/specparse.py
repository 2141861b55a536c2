"""Parsing `--worker ROLE[@HOST:PORT[/BOOTSTRAP_PORT]]` into a WorkerSpec. Pure."""

from __future__ import annotations

import re
from typing import Any

from infer_ctl.sim.config import ROLES, WorkerSpec

_WORKER = re.compile(r"^(?P<role>[a-z]+)(?:@(?P<host>\[[^\]]+\]|[^:/@]+):(?P<port>\d+)(?:/(?P<boot>\d+))?)?$")


def parse_worker(text: str, **knobs: Any) -> WorkerSpec:
    m = _WORKER.match(text.strip())
    if not m:
        raise ValueError(f"bad --worker {text!r}: expected ROLE[@HOST:PORT[/BOOTSTRAP_PORT]], e.g. prefill@127.0.0.1:30000/8998")
    role = m["role"]
    if role not in ROLES:
        raise ValueError(f"bad --worker {text!r}: role must be one of {', '.join(ROLES)}")
    boot = int(m["boot"]) if m["boot"] else None
    if boot is not None and role != "prefill":
        raise ValueError(f"bad --worker {text!r}: only a prefill worker has a bootstrap port")
    port = int(m["port"]) if m["port"] else 0
    for p in (port, boot or 0):
        if not 0 <= p <= 65535:
            raise ValueError(f"bad --worker {text!r}: port {p} is out of range")
    host = (m["host"] or "127.0.0.1").strip("[]")
    return WorkerSpec(role, host=host, port=port, bootstrap_port=boot, **knobs)  # type: ignore[arg-type]
