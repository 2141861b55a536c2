"""`scripts/test.sh --fast` (`-m "not slow"`) leaves out the end-to-end tests, marked in tests/conftest.py
by what they use rather than file by file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = [
    "tests/unit/test_paths.py",            # unit: stays in the fast loop
    "tests/remote/test_ssh_connector.py",  # real sshd (ssh_cluster)
    "tests/audit/test_audit_e2e.py",       # *e2e*
    "tests/bench/test_demo.py",            # the demo
]


def _collected(marker: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", marker, *FILES],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}


def test_end_to_end_tests_are_slow_and_unit_tests_are_not() -> None:
    assert _collected("slow") == set(FILES[1:])
    assert _collected("not slow") == {FILES[0]}
