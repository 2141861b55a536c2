"""Every install line for SGLang's CPU-only parser names the CPU torch build exactly
(`'torch==2.13.0+cpu'`, as scripts/install-test-deps.sh and .ci/run do): `torch==2.13.0` alone can
resolve to the CUDA wheel and pull gigabytes of nvidia-* packages onto a controller."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"torch==2\.13\.0(?!\+cpu)")


def _texts() -> dict[str, str]:
    paths = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "infer_ctl").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.sh"))]  # fmt: skip
    return {str(p.relative_to(ROOT)): p.read_text() for p in paths if p.is_file()}


def test_every_torch_pin_is_the_cpu_build() -> None:
    bare = {path: [m.start() for m in PIN.finditer(text)] for path, text in _texts().items()}
    assert {p: at for p, at in bare.items() if at} == {}


def test_check_args_remedy_installs_the_cpu_build() -> None:
    text = (ROOT / "infer_ctl" / "launch" / "commands.py").read_text()
    assert "pip install 'torch==2.13.0+cpu' && pip install --no-deps sglang==0.5.23" in text
