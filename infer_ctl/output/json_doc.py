"""The --json document: exactly one JSON object on stdout."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

from infer_ctl.core.report import Report


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False, default=str, ensure_ascii=False)


def write_report(report: Report, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(dumps(report.to_dict()) + "\n")
    stream.flush()
