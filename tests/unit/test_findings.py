"""Findings, aggregation to one status and exit code, the JSON document and the Prometheus textfile."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from infer_ctl.core.findings import Finding, Status, overall_status, worst
from infer_ctl.core.promtext import MetricFamily, findings_families, render
from infer_ctl.core.report import Report
from infer_ctl.exitcodes import ExitCode
from infer_ctl.output.textfile import write_textfile

S = Status


@pytest.mark.parametrize(
    ("statuses", "overall", "code"),
    [
        ([], S.OK, 0),
        ([S.OK, S.SKIP], S.OK, 0),
        ([S.SKIP], S.OK, 0),
        ([S.OK, S.WARN], S.WARN, 1),
        ([S.WARN, S.UNKNOWN], S.UNKNOWN, 3),
        ([S.UNKNOWN, S.FAIL, S.WARN], S.FAIL, 2),  # a failure outranks "could not tell"
        ([S.FAIL], S.FAIL, 2),
    ],
)
def test_aggregation(statuses: list[Status], overall: Status, code: int) -> None:
    findings = [Finding.make(s, "x.y", "n", "s", "m") for s in statuses]
    assert overall_status(findings) is overall
    assert Report("check", None, findings=findings).exit_code == code
    assert worst(statuses) is overall


def test_finding_is_frozen_and_serializable() -> None:
    f = Finding.fail("gpu.ecc", "pf-01", "GPU3", "2 volatile DBE", details={"dbe": 2, "pages": [1, 2]},
                     remedy="drain the node")
    with pytest.raises(AttributeError):
        f.status = S.OK  # type: ignore[misc]
    with pytest.raises(TypeError):
        f.details["dbe"] = 0  # type: ignore[index]
    assert f.to_dict() == {"check": "gpu.ecc", "code": None, "node": "pf-01", "subject": "GPU3", "status": "fail",
                           "message": "2 volatile DBE", "details": {"dbe": 2, "pages": [1, 2]},
                           "remedy": "drain the node"}
    assert Finding("a", "b", "c", "warn", "m").status is S.WARN  # type: ignore[arg-type]


def test_report_document_shape() -> None:
    report = Report("check gpu", "prod-a", duration_s=1.23456)
    report.extend([Finding.ok("gpu.count", "pf-01", "node", "8 GPUs"), Finding.warn("gpu.temp", "pf-01", "GPU1", "hot")])
    doc = report.to_dict()
    assert list(doc)[:7] == ["command", "profile", "started_at", "duration_s", "status", "exit_code", "findings"]
    assert doc["status"] == "warn" and doc["exit_code"] == 1 and doc["duration_s"] == 1.235
    assert doc["started_at"].endswith("Z")
    assert "results" not in doc
    json.dumps(doc)


def test_report_override_for_run_commands() -> None:
    report = Report("exec", "p", results=[{"node": "a", "ok": False}], exit_code_override=ExitCode.UNKNOWN)
    doc = report.to_dict()
    assert doc["status"] == "unknown" and doc["exit_code"] == 3 and doc["results"] == [{"node": "a", "ok": False}]


def test_prometheus_text_format() -> None:
    fam = MetricFamily("inferctl_x", 'help with "quotes"\nand newline').add(1.5, node='a"b\\c\n', check="z")
    text = render([fam])
    assert text.splitlines() == [
        '# HELP inferctl_x help with "quotes" and newline',
        "# TYPE inferctl_x gauge",
        'inferctl_x{check="z",node="a\\"b\\\\c\\n"} 1.5',
    ]
    with pytest.raises(ValueError):
        MetricFamily("bad-name", "h")
    with pytest.raises(ValueError):
        MetricFamily("ok", "h").add(1, **{"bad-label": "x"})


def test_findings_families_and_atomic_textfile(tmp_path: Path) -> None:
    findings = [Finding.ok("gpu.ecc", "pf-01", "GPU0", "ok"), Finding.fail("gpu.ecc", "pf-01", "GPU1", "dbe")]
    text = render(findings_families(findings, run_timestamp=1700000000, duration_s=2.5))
    assert 'inferctl_check_status{check="gpu.ecc",node="pf-01",subject="GPU1"} 2' in text
    assert 'inferctl_check_ok{check="gpu.ecc",node="pf-01",subject="GPU0"} 1' in text
    assert 'inferctl_findings{status="fail"} 1' in text
    assert "inferctl_last_run_timestamp_seconds 1700000000" in text
    assert "inferctl_last_run_duration_seconds 2.5" in text
    target = tmp_path / "sub" / "inferctl.prom"
    target_old = "old\n"
    target.parent.mkdir()
    target.write_text(target_old)
    write_textfile(target, text)
    assert target.read_text() == text
    assert [p.name for p in target.parent.iterdir()] == ["inferctl.prom"]  # no temp file left behind
    assert oct(os.stat(target).st_mode & 0o777) == "0o644"
