"""The audit history survives a torn last line and short writes."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from infer_ctl import atomicfile
from infer_ctl.checks import audit as A
from infer_ctl.checks.history import records_newest_first


def test_a_record_appended_after_a_torn_line_is_readable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hist = tmp_path / "audit.jsonl"
    A.append_history(hist, {"profile": "p", "n": 1})
    with hist.open("a") as fh:
        fh.write('{"profile": "p", "n": 2, "tor')  # disk full or a kill mid-write: no newline
    A.append_history(hist, {"profile": "p", "n": 3})
    with caplog.at_level(logging.WARNING, logger="infer_ctl.history"):
        got = [r["n"] for r in records_newest_first(hist, "p")]
    assert got == [3, 1]  # before: the torn line swallowed record 3 (one unreadable line)
    assert "line 2 is not a JSON record" in caplog.text
    assert hist.read_text().count("\n") == 3


def test_an_append_to_a_clean_file_adds_no_blank_line(tmp_path: Path) -> None:
    hist = tmp_path / "a" / "audit.jsonl"
    for n in range(3):
        A.append_history(hist, {"n": n})
    assert hist.read_text().splitlines() == [json.dumps({"n": n}, separators=(",", ":")) for n in range(3)]


def test_short_writes_are_finished_or_fail_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hist = tmp_path / "audit.jsonl"
    real = os.write
    monkeypatch.setattr(atomicfile.os, "write", lambda fd, data: real(fd, bytes(data[:5])))  # 5 bytes a call
    A.append_history(hist, {"profile": "p", "n": 1})
    assert json.loads(hist.read_text()) == {"profile": "p", "n": 1}
    monkeypatch.setattr(atomicfile.os, "write", lambda fd, data: 0)  # a full disk that writes nothing
    with pytest.raises(atomicfile.ShortWrite, match="wrote 0 of"):
        A.append_history(hist, {"profile": "p", "n": 2})
