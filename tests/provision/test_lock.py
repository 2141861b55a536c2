"""One dependency set for every node: `provision lock` resolves SGLang's dependencies once (pip's
--report, nothing installed) into a lockfile; nodes install exactly it (`sglang.lock_file`), and
`wheelhouse build --lock` downloads exactly it. The torch build's CUDA is matched to the node's driver.

Real: pip (resolving and installing from a local index of tiny real wheels, tests/provision/wheels.py),
sshd nodes with private /etc, /opt, /var (conftest.py), python -m venv on the node. Stand-in: nvidia-smi.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.provision.driver import torch_cuda_fit
from infer_ctl.core.provision.lock import lock_entries, lock_from_pip_report, torch_cuda_of_lock, venv_dir
from infer_ctl.remote.base import Command
from tests.provision.test_provision_e2e import entries, on_node, run_cli
from tests.provision.wheels import build_wheel

TORCH = "2.13.0+cu129"


def _index(root: Path) -> Path:
    index = root / "index"
    build_wheel(index, "tinydep", "1.0")
    build_wheel(index, "torch", TORCH, extra={"torch/version.py": b"__version__ = '2.13.0+cu129'\ncuda: Optional[str] = '12.9'\n"})
    build_wheel(index, "sglang", "0.5.23", ["tinydep>=1.0", "torch==2.13.0"])
    return index


def _lock(tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp_path / "sglang-0.5.23.lock"
    code = main(["provision", "lock", "--out", str(out), "--requirement", "sglang==0.5.23", "--pip-arg=--no-index",
                 f"--pip-arg=--find-links={index}", "--json"])  # fmt: skip
    assert code == 0, capsys.readouterr()
    capsys.readouterr()
    return out


def test_provision_lock_pins_every_package_by_version_and_sha256(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = _index(tmp_path)
    lock = _lock(tmp_path, index, capsys).read_text()
    digest = {p.name.split("-")[0]: hashlib.sha256(p.read_bytes()).hexdigest() for p in index.glob("*.whl")}
    assert lock == (f"sglang==0.5.23 --hash=sha256:{digest['sglang']}\n"
                    f"tinydep==1.0 --hash=sha256:{digest['tinydep']}\n"
                    f"torch=={TORCH} --hash=sha256:{digest['torch']}\n")  # fmt: skip
    assert torch_cuda_of_lock(lock) == "12.9" and set(lock_entries(lock)) == {"sglang", "tinydep", "torch"}
    with pytest.raises(ValueError, match="gives no version and sha256"):
        lock_from_pip_report({"install": [{"metadata": {"name": "x", "version": "1"}, "download_info": {"url": "file:///x"}}]})


@pytest.mark.parametrize(("torch_cuda", "driver", "kind"), [
    ("12.4", "12.4", "ok"), ("12.1", "12.4", "ok"), ("12.9", "12.4", "warn"), ("13.0", "12.9", "manual"),
])  # fmt: skip
def test_torch_cuda_against_the_drivers_cuda(torch_cuda: str, driver: str, kind: str) -> None:
    assert torch_cuda_fit(torch_cuda, driver)[0] == kind


@pytest.mark.ssh
def test_nodes_install_exactly_the_lock_and_the_wheelhouse_is_built_from_it(
    prov_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = _index(tmp_path)
    lock = _lock(tmp_path, index, capsys)
    build_wheel(index, "tinydep", "1.1")  # published after the lock was made: a node resolving on its own takes it
    pc = prov_cluster(1)
    profile = pc.profile(sglang={"lock_file": str(lock)})
    # the node's index: this directory (its /etc is private to it; conftest's venv stand-in copies it in)
    conf = f"mkdir -p /etc/inferctl-test && printf '[global]\\nno-index = true\\nfind-links = {index}\\n' > /etc/inferctl-test/pip.conf"
    assert on_node(profile, Command("sh", "-c", conf)).ok
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "--only", "venv", "-p", str(profile))
    assert code == 1, [(e["kind"], e["subject"], e["summary"]) for e in entries(doc) if e["step"] == "venv"]  # the torch build does not fit the driver (a WARN), everything else is applied
    target = venv_dir("/opt/inferctl/venvs", "0.5.23", lock.read_text())
    versions = on_node(profile, Command(f"{target}/bin/python", "-c", "import importlib.metadata as m; "
                                        "print(m.version('tinydep'), m.version('torch'))"))  # fmt: skip
    assert versions.out.split() == ["1.0", TORCH]  # the lock's, not the index's newest
    cuda = [e for e in entries(doc) if e["subject"] == f"{target} torch CUDA"]
    assert [(e["kind"], e["summary"]) for e in cuda] == [("warn", (
        "torch is built for CUDA 12.9, the driver supports CUDA 12.4: it runs under minor version "
        "compatibility only (PTX JIT and newer-driver features fail)"))]
    assert "download.pytorch.org/whl/cu124" in cuda[0]["remedy"]

    # the wheelhouse of the same lock: the same files, the lock byte for byte, so the same venv
    out = tmp_path / "wh"
    code = main(["provision", "wheelhouse", "build", "--out", str(out), "--lock", str(lock), "--pip-arg=--no-index",
                 f"--pip-arg=--find-links={index}", "--json"])  # fmt: skip
    assert code == 0
    assert (out / "requirements.lock").read_text() == lock.read_text()
    assert sorted(p.name for p in out.glob("*.whl")) == ["sglang-0.5.23-py3-none-any.whl", "tinydep-1.0-py3-none-any.whl",
                                                         f"torch-{TORCH}-py3-none-any.whl"]  # fmt: skip
    both = pc.profile(pc.tmp / "both.yaml", sglang={"lock_file": str(lock), "wheelhouse": str(out)})
    code, doc = run_cli(capsys, "provision", "--only", "wheelhouse,venv", "-p", str(both))
    venv = [e for e in entries(doc) if e["step"] == "venv" and e["subject"] == target]
    assert venv and venv[0]["kind"] == "ok", entries(doc)  # already built, from the same lock
