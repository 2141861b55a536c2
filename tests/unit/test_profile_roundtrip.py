"""`profile show` round-trips: its output, piped or redirected, is a profile that validates and shows the
same as the original (rich used to crop lines at 80 columns, so `> x.yaml` cut "RoCEv2 400G" to
"RoCEv2 40" and the damaged file still validated).

`profile show` runs as a real process whose stdout is a pipe or a file, as a user's shell would give it,
not through CliRunner (which swaps stdout for an in-memory buffer and so hides how the output is written).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.resources import profiles_dir

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [str(p) for p in sorted(profiles_dir().glob("*.yaml"))] + ["builtin:local"]
#: keys of a JSON document that differ between any two runs
VOLATILE = ("started_at", "duration_s")


def _show_through(profile: str, dest: Path, *, pipe: bool) -> None:
    """`inferctl profile show -p PROFILE > dest` (or `| cat > dest`), in a narrow non-terminal setting."""
    env = {**os.environ, "COLUMNS": "40", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "infer_ctl", "profile", "show", "-p", profile]
    if pipe:
        out = subprocess.run(cmd, capture_output=True, env=env, timeout=60)  # stdout: a pipe
        assert out.returncode == 0, out.stderr
        dest.write_bytes(out.stdout)
    else:
        with dest.open("wb") as fh:
            out = subprocess.run(cmd, stdout=fh, stderr=subprocess.PIPE, env=env, timeout=60)
        assert out.returncode == 0, out.stderr


def _json(argv: list[str], path: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(argv)
    doc = json.loads(capsys.readouterr().out.replace(path, "PROFILE"))
    if isinstance(doc, dict):
        for key in VOLATILE:
            doc.pop(key, None)
    return code, doc


@pytest.mark.parametrize("pipe", [False, True], ids=["redirect", "pipe"])
@pytest.mark.parametrize("profile", SHIPPED, ids=lambda p: Path(p).name)
def test_show_output_round_trips(
    profile: str, pipe: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    original = str(profiles_dir() / "local.yaml") if profile == "builtin:local" else profile
    # prefix files are relative to the profile's directory: the copy sits beside the same prompts
    shutil.copytree(profiles_dir() / "prompts", tmp_path / "prompts")
    copy = tmp_path / "x.yaml"
    _show_through(profile, copy, pipe=pipe)

    text = copy.read_text(encoding="utf-8")
    assert "\x1b[" not in text, "colour codes in piped output"
    assert all(line == line.rstrip() for line in text.splitlines()), "padded lines in piped output"

    assert _json(["profile", "validate", "-p", str(copy), "--json"], str(copy), capsys) == _json(
        ["profile", "validate", "-p", original, "--json"], original, capsys
    )
    assert _json(["profile", "show", "-p", str(copy), "--json"], str(copy), capsys) == _json(
        ["profile", "show", "-p", original, "--json"], original, capsys
    )


def test_long_values_stay_on_one_line(tmp_path: Path) -> None:
    """A value longer than any terminal stays one line: a file people grep and diff."""
    long = "word " * 60 + "end"
    src = tmp_path / "p.yaml"
    src.write_text(
        f"name: t\ndescription: {long}\ncollocated: true\nnodes:\n  - {{name: a, host: 10.0.0.1, roles: [prefill]}}\n"
        "models:\n  target: {path: /m}\n"
    )
    dest = tmp_path / "x.yaml"
    _show_through(str(src), dest, pipe=True)
    assert f"description: {long}\n" in dest.read_text()
