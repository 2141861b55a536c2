"""Prometheus text exposition format (0.0.4) for node_exporter's textfile collector. Pure: builds text.

Writing the file atomically is `infer_ctl.output.textfile.write_textfile`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from infer_ctl.core.findings import Finding, Status

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


@dataclass
class MetricFamily:
    name: str
    help: str
    type: str = "gauge"
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _METRIC_NAME.match(self.name):
            raise ValueError(f"invalid metric name {self.name!r}")
        if self.type not in {"gauge", "counter", "untyped"}:
            raise ValueError(f"unsupported metric type {self.type!r}")

    def add(self, value: float, **labels: str) -> MetricFamily:
        for label in labels:
            if not _LABEL_NAME.match(label):
                raise ValueError(f"invalid label name {label!r}")
        self.samples.append((dict(labels), float(value)))
        return self


def render(families: Iterable[MetricFamily]) -> str:
    lines: list[str] = []
    for fam in families:
        lines.append(f"# HELP {fam.name} {fam.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            if labels:
                body = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(labels.items()))
                lines.append(f"{fam.name}{{{body}}} {format_value(value)}")
            else:
                lines.append(f"{fam.name} {format_value(value)}")
    return "\n".join(lines) + "\n"


STATUS_CODES: Mapping[Status, int] = {
    Status.OK: 0,
    Status.WARN: 1,
    Status.FAIL: 2,
    Status.UNKNOWN: 3,
    Status.SKIP: 0,
}


def findings_families(
    findings: Iterable[Finding], *, prefix: str = "inferctl", run_timestamp: float, duration_s: float
) -> list[MetricFamily]:
    """Gauges for an audit run: one series per (check, node, subject) plus per-status counts.

    `<prefix>_check_status` carries the numeric status (0 ok, 1 warn, 2 fail, 3 unknown) so one alert
    rule (`> 1`) covers failures and unknowns; `<prefix>_check_ok` is 1/0 for dashboards.
    """
    findings = list(findings)
    status = MetricFamily(f"{prefix}_check_status", "Check status: 0 ok, 1 warn, 2 fail, 3 unknown")
    ok = MetricFamily(f"{prefix}_check_ok", "1 if the check passed (ok or skip), else 0")
    counts = MetricFamily(f"{prefix}_findings", "Number of findings of the last run, by status")
    for f in findings:
        labels = {"check": f.check, "node": f.node, "subject": f.subject}
        if f.code is not None:  # the stable code (core/finding_codes.py): alerts can route on it
            labels = {"check": f.check, "code": f.code, "node": f.node, "subject": f.subject}
        status.add(STATUS_CODES[f.status], **labels)
        ok.add(1 if f.status in (Status.OK, Status.SKIP) else 0, **labels)
    for st in Status:
        counts.add(sum(1 for f in findings if f.status is st), status=st.value)
    last = MetricFamily(f"{prefix}_last_run_timestamp_seconds", "Unix time the last run finished")
    last.add(run_timestamp)
    dur = MetricFamily(f"{prefix}_last_run_duration_seconds", "Duration of the last run")
    dur.add(duration_s)
    return [status, ok, counts, last, dur]
