"""Parsing `sim serve` options: `--worker ROLE[@HOST:PORT[/BOOTSTRAP_PORT]]` into a WorkerSpec, the
speculative options into WorkerSpec fields. Pure."""

from __future__ import annotations

import re
from typing import Any

from infer_ctl.sim.config import ROLES, WorkerSpec
from infer_ctl.sim.spec_workload import SpecWorkload, parse_domain_alpha, parse_drift

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


def spec_knobs(
    *,
    domains: list[str] | None = None,
    default_domain: str | None = None,
    drift: list[str] | None = None,
    draft_tokenizer_mismatch: bool = False,
    adaptive: bool = False,
    adaptive_config: str | None = None,
    gamma: int | None = None,
    decode_log_interval: int | None = None,
) -> dict[str, Any]:
    """WorkerSpec fields from `sim serve`'s speculative options (`--spec-domain code=0.9`,
    `--spec-drift 30:chat=0.4`, ...); raises ValueError. Each worker gets its own copy of the workload
    (`fresh_workloads`), so a shift on one worker leaves the others alone."""
    workload = SpecWorkload(
        domains=dict(parse_domain_alpha(d) for d in domains or []),
        default_domain=default_domain,
        drift=tuple(parse_drift(d) for d in drift or []),
        draft_tokenizer_mismatch=draft_tokenizer_mismatch,
    )
    knobs: dict[str, Any] = {"spec_workload": workload, "spec_adaptive": adaptive,
                             "spec_adaptive_config": adaptive_config}
    if gamma is not None:
        knobs["spec_gamma"] = gamma
    if decode_log_interval is not None:
        knobs["decode_log_interval"] = decode_log_interval
    return knobs


def fresh_workloads(specs: list[WorkerSpec]) -> list[WorkerSpec]:
    """Give every spec its own SpecWorkload (specs built from one knobs dict share one)."""
    for s in specs:
        s.spec_workload = s.spec_workload.copy()
    return specs
