"""`check gpu --diag-timeout` refuses what is not a finite number of seconds, at least 1, before any node is
reached (NaN read "should be greater than or equal to 1"; inf passed, leaving the diagnostic unbounded)."""

from __future__ import annotations

import json

import pytest

from infer_ctl.cli.main import main


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0.5", "soon"])
def test_diag_timeout_must_be_a_finite_number_of_seconds(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "gpu", "--diag", "1", "--diag-timeout", value]) == 64
    err = capsys.readouterr().err
    assert "Invalid value for '--diag-timeout': must be a number of seconds, 1 or more" in err, err


def test_json_usage_error_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    # --json: stdout is one JSON document whose error names the option, as the stderr line does
    assert main(["check", "gpu", "--json", "--diag", "1", "--diag-timeout", "nan"]) == 64
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 64 and doc["error"]["remedy"] == "see --help"
    assert doc["error"]["message"].startswith("Invalid value for '--diag-timeout': must be a number of seconds")
