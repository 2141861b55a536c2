"""`dcgmi diag -r N -j`: the command and a parser of its JSON.

Two shapes, both read (key names from DCGM's nvvs/include/NvvsJsonStrings.h; the 4.x schema is
testing/python3/dcgm_diag_schema.json, DCGM 4.6.0):

- DCGM 3.x: `{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
  [{"gpu_ids": 0 | "0,1,2", "status": "PASS", "warnings": [...], "info": ...}]}]}], "version"}}`. Its
  own test (nvvs/src/tests/JsonResultTests.cpp, "Deserialize real output") shows a line before the JSON
  and `null` entries between tests; statuses are upper case. Warnings are strings or objects.
- DCGM 4.x: `{"DCGM Diagnostic": {"test_categories": [... "tests": [{"name", "results": [{"entity_group":
  "GPU", "entity_group_id", "entity_id", "status": "Pass", "warnings": [{"warning", "error_id",
  "error_category", "error_severity"}], "info": [...]}], "test_summary": {"status"}}]}]}, "entity_groups":
  [...serial_num...], "metadata": {"version", "Driver Version Detected"}}`; a run that could not start is
  `{"DCGM Diagnostic": {"runtime_error": "...", "version"}}` (dcgmi/Diag.cpp HelperDisplayFailureMessage).
"""

from __future__ import annotations

import json
from typing import Any

from infer_ctl.core.diag.dcgm import DcgmDiag, DcgmResult, DcgmWarning
from infer_ctl.remote.base import Command

_STATUS = {"pass": "pass", "passed": "pass", "fail": "fail", "failed": "fail", "warn": "warn", "warning": "warn",
           "skip": "skip", "skipped": "skip", "not run": "notrun", "notrun": "notrun", "n/a": "skip"}
#: how long each run level may take on an 8-GPU node before the node-side `timeout` stops it (DCGM's
#: documentation gives level 1 seconds, level 2 about 2 minutes, level 3 about 30 minutes, level 4 1-2 h)
LEVEL_TIMEOUT_S = {1: 300, 2: 900, 3: 3600, 4: 10800}


class DcgmOutputError(ValueError):
    pass


def diag_command(level: int, *, dcgmi: str = "dcgmi", timeout_s: float | None = None) -> Command:
    """`dcgmi diag -r N -j` under the node's `timeout` (a diagnostic outliving the SSH command would keep
    the GPUs busy); `dcgmi` may be missing: the shell says so with exit 127."""
    limit = int(timeout_s or LEVEL_TIMEOUT_S.get(level, 3600))
    return Command("timeout", "-k", "10", str(limit), dcgmi, "diag", "-r", str(level), "-j")


def _status(raw: Any) -> str:
    return _STATUS.get(str(raw or "").strip().lower(), "notrun")


def _warnings(raw: Any) -> tuple[DcgmWarning, ...]:
    items = raw if isinstance(raw, list) else ([] if raw in (None, "") else [raw])
    out = []
    for w in items:
        if isinstance(w, dict):
            msg = str(w.get("warning") or w.get("message") or "").strip()
            out.append(DcgmWarning(msg, _int(w.get("error_id", w.get("error_code"))), _int(w.get("error_category")),
                                   _int(w.get("error_severity"))))
        elif w is not None:
            out.append(DcgmWarning(str(w).strip()))
    return tuple(x for x in out if x.message)


def _info(raw: Any) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else ([] if raw in (None, "") else [raw])
    return tuple(str(i).strip() for i in items if i is not None and str(i).strip())


def _int(v: Any) -> int | None:
    try:
        return None if v is None or isinstance(v, bool) else int(v)
    except (TypeError, ValueError):
        return None


def _subject(result: dict[str, Any]) -> str:
    if "entity_id" in result:  # DCGM 4.x
        return f"{result.get('entity_group') or 'GPU'}{result['entity_id']}"
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if isinstance(ids, int) and not isinstance(ids, bool):
        return f"GPU{ids}"
    text = str(ids if ids is not None else "").strip()
    if text.isdigit():
        return f"GPU{text}"
    # DCGM 3.x reports a deployment test once for all GPUs ("0,1,2,3,4,5,6,7"): a finding of the node
    return "node"


def parse_diag(text: str) -> DcgmDiag:
    """Parse dcgmi's stdout (anything before the first `{` is skipped: DCGM prints warnings there)."""
    start = text.find("{")
    if start < 0:
        raise DcgmOutputError(_first_line(text) or "no output")
    try:
        doc, _ = json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        raise DcgmOutputError(f"dcgmi printed no valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(doc, dict):
        raise DcgmOutputError("dcgmi's JSON is not an object")
    root = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(root, dict):
        raise DcgmOutputError("no 'DCGM Diagnostic' object in dcgmi's JSON")
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    diag = DcgmDiag(version=str(meta.get("version") or root.get("version") or "") or None,
                    driver=str(meta.get("Driver Version Detected") or root.get("Driver Version Detected")
                               or doc.get("Driver Version Detected") or "") or None,
                    runtime_error=str(root["runtime_error"]) if root.get("runtime_error") else None)
    for group in doc.get("entity_groups") or []:
        if isinstance(group, dict):
            for e in group.get("entities") or []:
                if isinstance(e, dict) and e.get("serial_num") and e.get("entity_id") is not None:
                    diag.serials[f"{group.get('entity_group') or 'GPU'}{e['entity_id']}"] = str(e["serial_num"])
    for cat in root.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        category = str(cat.get("category") or "")
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):  # DCGM 3.x writes `null` between tests
                continue
            name = str(test.get("name") or "?")
            results = [r for r in test.get("results") or [] if isinstance(r, dict)]
            if not results and isinstance(test.get("test_summary"), dict):
                summary = test["test_summary"]
                diag.results.append(DcgmResult(category, name, "node", _status(summary.get("status")),
                                               _warnings(summary.get("warnings")), _info(summary.get("info"))))
            for r in results:
                diag.results.append(DcgmResult(category, name, _subject(r), _status(r.get("status")),
                                               _warnings(r.get("warnings", r.get("warning"))), _info(r.get("info"))))
    return diag


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


__all__ = ["LEVEL_TIMEOUT_S", "DcgmOutputError", "diag_command", "parse_diag"]
