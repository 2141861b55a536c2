"""The core package is pure: it must not import I/O or UI libraries (docs/architecture.md, 'Layers')."""

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "infer_ctl" / "core"
FORBIDDEN = {
    "typer",
    "rich",
    "paramiko",
    "httpx",
    "aiohttp",
    "uvloop",
    "click",
    "socket",
    "subprocess",
    "requests",
    "asyncio",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_no_io_or_ui_library(path: Path) -> None:
    bad = _imports(path) & FORBIDDEN
    assert not bad, f"{path} imports {sorted(bad)}; core must stay pure"


def test_core_imports_cleanly_without_ui_libraries() -> None:
    import subprocess
    import sys

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
