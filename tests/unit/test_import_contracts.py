"""The layering contracts (pyproject.toml `[tool.importlinter]`, run by scripts/test.sh) really fail
when broken: shown on a throwaway package, and on a copy of infer_ctl with one upward import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# `lint-imports` without depending on PATH: the same entry point, run by this interpreter
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def _lint(where: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", "--no-logo", str(config)],
        cwd=where, env={"PYTHONPATH": str(where), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )


TOY_CONFIG = """
[tool.importlinter]
root_package = "toypkg"
include_external_packages = true

[[tool.importlinter.contracts]]
name = "toy layers"
type = "layers"
containers = ["toypkg"]
layers = ["high", "low"]

[[tool.importlinter.contracts]]
name = "low is pure"
type = "forbidden"
source_modules = ["toypkg.low"]
forbidden_modules = ["socket"]
"""


def _toy(tmp_path: Path, low_source: str) -> Path:
    pkg = tmp_path / "toypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from toypkg import low\n")
    (pkg / "low.py").write_text(low_source)
    (tmp_path / "pyproject.toml").write_text(TOY_CONFIG)
    return tmp_path / "pyproject.toml"


def test_a_kept_contract_passes(tmp_path: Path) -> None:
    done = _lint(tmp_path, _toy(tmp_path, "VALUE = 1\n"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_an_upward_import_and_a_forbidden_library_break_their_contracts(tmp_path: Path) -> None:
    done = _lint(tmp_path, _toy(tmp_path, "import socket\n\nfrom toypkg import high\n"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 kept, 2 broken" in done.stdout
    assert "toypkg.low -> toypkg.high (l.3)" in done.stdout
    assert "toypkg.low -> socket (l.1)" in done.stdout


def _lint_copy_with(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """The project's own configuration, on a copy of infer_ctl with `line` added to `module` (a path
    inside infer_ctl/)."""
    copy = tmp_path / "infer_ctl"
    shutil.copytree(ROOT / "infer_ctl", copy, ignore=shutil.ignore_patterns("__pycache__"))
    source = copy / module
    source.write_text(source.read_text() + "\n" + line + "  # noqa: E402  (the violation under test)\n")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return _lint(tmp_path, tmp_path / "pyproject.toml")


def test_the_projects_contracts_catch_an_upward_import(tmp_path: Path) -> None:
    """The project's own configuration, on a copy of infer_ctl where core imports the CLI."""
    done = _lint_copy_with(tmp_path, "core/findings.py", "from infer_ctl.cli import main as _upward")
    assert done.returncode == 1, done.stdout + done.stderr
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert "infer_ctl.core is not allowed to import infer_ctl.cli" in broken
    assert "infer_ctl.core.findings -> infer_ctl.cli.main" in broken
    assert "No cycles are allowed in infer_ctl" in broken  # cli imports core: now a circle


def test_the_router_rooms_catch_an_upward_import(tmp_path: Path) -> None:
    """Inside the router (the `router-rooms` contract): its HTTP plumbing imports the request path."""
    done = _lint_copy_with(tmp_path, "router/http/jsonio.py", "from infer_ctl.router.request import proxy as _up")
    assert done.returncode == 1, done.stdout + done.stderr
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert "infer_ctl.router.http is not allowed to import infer_ctl.router.request" in broken
    assert "infer_ctl.router.http.jsonio -> infer_ctl.router.request.proxy" in broken
    assert "No cycles are allowed in infer_ctl.router" in broken  # request imports http: now a circle


def test_core_imports_cleanly_without_ui_libraries() -> None:
    """At run time too (a dynamic import is invisible to the static contracts): importing every core
    module loads no UI, SSH or HTTP library."""
    code = (
        "import sys, importlib, pkgutil, infer_ctl.core as c\n"
        "for m in pkgutil.walk_packages(c.__path__, 'infer_ctl.core.'): importlib.import_module(m.name)\n"
        "bad = sorted(n for n in ('typer','rich','paramiko','httpx','aiohttp') if n in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"importing infer_ctl.core pulled in {out}"
