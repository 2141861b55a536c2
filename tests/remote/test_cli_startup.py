"""`--help` of the fleet commands must not pay for paramiko or the pydantic profile models (~0.4 s of
imports measured with `python -X importtime`): they are imported inside the commands."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import contextlib, io, json, sys
from infer_ctl.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(sys.argv[1:])
heavy = sorted(m for m in ("paramiko", "infer_ctl.profile", "infer_ctl.remote.fleet") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize("argv", [["exec", "--help"], ["nodes", "--help"], ["audit", "--help"]])
def test_help_does_not_import_the_ssh_stack_or_the_profile_models(argv):
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 0, "heavy": []}, done.stderr


@pytest.mark.parametrize("module", ["infer_ctl.cli.check_gpu", "infer_ctl.cli.audit_cmd", "infer_ctl.cli.exec_cmd"])
def test_importing_a_fleet_command_module_stays_light(module):
    probe = f"import sys, {module}; print(sorted(m for m in ('paramiko', 'infer_ctl.profile') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr
