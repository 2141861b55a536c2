"""One list of check families (checks/family_names.py) drives both `inferctl check <family>` and the
audit registry, in the same order, and the CLI reads it without importing any family."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infer_ctl.checks.family_names import FAMILY_NAMES
from infer_ctl.checks.registry import FAMILY_MODULES, family_name_of
from infer_ctl.cli.main import main


def test_the_registry_runs_the_named_families_in_order() -> None:
    assert [family_name_of(m) for m in FAMILY_MODULES] == list(FAMILY_NAMES)


def test_check_help_lists_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--help"]) == 0
    out = capsys.readouterr().out
    for name in FAMILY_NAMES:
        assert f" {name} " in out, out


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_check_family_loads_only_its_own_modules(name: str) -> None:
    """`inferctl check gpu --help` imports cli/check_gpu.py only, not the other families' CLI or check
    modules (and not the registry, which imports the profile models)."""
    code = (
        "import contextlib, io, sys\n"
        "from infer_ctl.cli.main import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()): code = main(['check', {name!r}, '--help'])\n"
        "mods = sorted(m for m in sys.modules if m.startswith(('infer_ctl.cli.check_', 'infer_ctl.checks.')))\n"
        "print(code, ','.join(mods))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    code_s, mods = out.split()
    assert code_s == "0"
    expected = {"infer_ctl.cli.check_cmd", "infer_ctl.checks.family_names", f"infer_ctl.cli.check_{name}"}
    assert set(mods.split(",")) == expected
