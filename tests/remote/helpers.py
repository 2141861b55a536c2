"""Helpers for remote tests: load a harness profile, run the CLI in-process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.profile import Profile
from infer_ctl.profile.load import validate_profile_data
from tests.sshd_harness import SshCluster


def profile_of(cluster: SshCluster, **overrides: Any) -> Profile:
    return validate_profile_data(cluster.profile_data(**overrides))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run_cli(capsys, *argv)
    try:
        return code, json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(
            f"stdout is not one JSON document (exit {code}):\n{out}\nstderr:\n{err}"
        ) from None
