"""The `inferctl` step: this controller's code (and nvidia-ml-py) in `<venvs>/inferctl` on the node.

Real: sshd, the venv (`python -m venv --without-pip`), the upload, the node-side sha256 and RECORD
checks, the GPU gatherer run by the node's new interpreter. The installer script is also run locally on
wheels with a tampered member, which it must refuse.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import infer_ctl
from infer_ctl.facts.nvml_gatherer import gather_command, gatherer_document, gatherer_script
from infer_ctl.profile.load import load_profile
from infer_ctl.provision.selfwheel import BuiltWheel, bundle_id, inferctl_wheel, make_wheel
from infer_ctl.provision.steps.selfinstall import MARKER, installer_script
from infer_ctl.remote.base import Command
from infer_ctl.remote.fleet import Fleet
from tests.provision.test_provision_e2e import entries, on_node, run_cli

VENVS = "/opt/inferctl/venvs"


def step_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in entries(doc) if e["step"] == "inferctl"]


@pytest.mark.ssh
def test_inferctl_step_installs_this_code_and_is_idempotent(prov_cluster, capsys, monkeypatch, frozen_node_wheels) -> None:
    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile()
    before = pc.checksum(node)
    code, doc = run_cli(capsys, "provision", "-p", str(profile), "--only", "inferctl")
    assert code == 1
    install, link = step_entries(doc)
    assert (install["kind"], link["kind"]) == ("change", "change")
    assert install["summary"] == f"install inferctl {infer_ctl.__version__}: not installed"
    assert link["subject"] == f"{VENVS}/inferctl" and link["before"] == "<none>"
    assert pc.checksum(node) == before

    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--only", "inferctl")
    assert code == 0, doc
    assert {e["kind"] for e in step_entries(doc)} == {"ok"}

    # the node's new interpreter runs the GPU gatherer from the installed package, with NVML bindings
    python = f"{VENVS}/inferctl/bin/python"
    where = on_node(profile, Command(python, "-c", "import infer_ctl, pynvml; print(infer_ctl.__file__)"))
    assert where.ok, where.err
    assert where.out.startswith(f"{VENVS}/inferctl/lib/")  # the venv's copy, not this checkout
    gathered = on_node(profile, gather_command(python, source="nvml"), stdin=gatherer_script())
    doc_gpu = gatherer_document(gathered.out.strip().splitlines()[-1])  # plain or --compress'd
    # pynvml imported (no driver here, so its shared library is what is missing, not the bindings)
    assert "Shared Library" in doc_gpu["nvml_error"]["message"], doc_gpu

    # idempotent: nothing to do, nothing changed by a second apply
    settled = pc.checksum(node)
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--only", "inferctl")
    assert code == 0 and doc["results"][0]["applied"] == []
    assert pc.checksum(node) == settled

    # new controller code: a new versioned venv, the link switched from the old one (which stays)
    old_target = pc.node_path(node, f"{VENVS}/inferctl").readlink()
    newer = [make_wheel("inferctl", "9.9.9", [("infer_ctl/__init__.py", b"__version__ = '9.9.9'\n")], "t")]
    monkeypatch.setattr("infer_ctl.provision.runner.node_wheels", lambda: newer)
    monkeypatch.setattr(infer_ctl, "__version__", "9.9.9")
    code, doc = run_cli(capsys, "provision", "-p", str(profile), "--only", "inferctl")
    install, link = step_entries(doc)
    assert code == 1 and install["kind"] == "change" and link["kind"] == "change"
    assert link["before"] == f"{old_target} (inferctl {infer_ctl_version_of(frozen_node_wheels)})"
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--only", "inferctl")
    assert code == 0, doc
    new_target = pc.node_path(node, f"{VENVS}/inferctl").readlink()
    assert new_target.name == f"inferctl-9.9.9-{bundle_id(newer)[:12]}"
    assert pc.node_path(node, str(old_target)).is_dir()

    # an install interrupted before its marker is rebuilt, not trusted
    assert on_node(profile, Command("rm", "--", f"{new_target}/{MARKER}")).ok
    code, doc = run_cli(capsys, "provision", "-p", str(profile), "--only", "inferctl")
    assert code == 1 and step_entries(doc)[0]["summary"] == "install inferctl 9.9.9: incomplete (an interrupted install?)"
    code, doc = run_cli(capsys, "provision", "--apply", "--yes", "-p", str(profile), "--only", "inferctl")
    assert code == 0, doc


def infer_ctl_version_of(wheels: list[BuiltWheel]) -> str:
    return wheels[0].filename.split("-")[1]


def test_wheels_are_deterministic() -> None:
    assert inferctl_wheel().sha256 == inferctl_wheel().sha256
    one = make_wheel("x", "1", [("x/a.py", b"a")], "s")
    assert one.sha256 == make_wheel("x", "1", [("x/a.py", b"a")], "s").sha256
    assert one.sha256 != make_wheel("x", "1", [("x/a.py", b"b")], "s").sha256


def _install_locally(tmp: Path, wheel: Path) -> subprocess.CompletedProcess[bytes]:
    venv = tmp / "venv"
    if not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return subprocess.run([str(venv / "bin" / "python"), "-", str(wheel)], input=installer_script(),
                          capture_output=True, check=False)


def test_node_installer_refuses_a_tampered_member_and_installs_a_good_wheel(tmp_path: Path) -> None:
    good = make_wheel("demo-pkg", "1.0", [("demo_pkg/__init__.py", b"VALUE = 42\n")], "demo")
    path = tmp_path / good.filename
    path.write_bytes(good.data)
    tampered = tmp_path / "tampered" / good.filename
    tampered.parent.mkdir()
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tampered, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, b"VALUE = 666\n" if item.filename == "demo_pkg/__init__.py" else data)

    refused = _install_locally(tmp_path, tampered)
    assert refused.returncode == 1 and b"does not match the wheel's RECORD" in refused.stderr
    assert not list((tmp_path / "venv").rglob("demo_pkg"))

    done = _install_locally(tmp_path, path)
    assert done.returncode == 0, done.stderr
    check = subprocess.run([str(tmp_path / "venv" / "bin" / "python"), "-c",
                            "import demo_pkg, importlib.metadata as m; print(demo_pkg.VALUE, m.version('demo-pkg'))"],
                           capture_output=True, text=True, check=True)
    assert check.stdout.split() == ["42", "1.0"]


def _python_outside_any_venv() -> str:
    """The base interpreter, whether or not the suite itself runs in a virtualenv (sys.executable is the
    venv's python there, which the installer rightly accepts)."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base) if base.exists() else sys._base_executable  # type: ignore[attr-defined]


def test_node_installer_refuses_to_run_outside_a_venv(tmp_path: Path) -> None:
    python = _python_outside_any_venv()
    probe = subprocess.run([python, "-c", "import sys; print(sys.prefix == sys.base_prefix)"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "True", f"{python} runs inside a venv"
    # No wheel exists at this path: an installer that got past its venv check would fail on opening it
    # (another message), so this test can never install anything into the base interpreter.
    missing = tmp_path / "never-written" / "x-1-py3-none-any.whl"
    proc = subprocess.run([python, "-", str(missing)], input=installer_script(), capture_output=True, check=False)
    assert proc.returncode == 1 and b"outside a venv" in proc.stderr, proc.stderr
    assert b"installed" not in proc.stdout
    # the same call from a venv's python gets past the check (and fails on the missing wheel instead)
    inside = _install_locally(tmp_path, missing)
    assert inside.returncode == 1 and b"outside a venv" not in inside.stderr, inside.stderr


@pytest.mark.ssh
def test_big_files_go_up_in_parts_and_are_joined_atomically(prov_cluster, tmp_path: Path) -> None:
    """upload_file never holds more than one part in memory; the joined file is byte-identical and no
    part or temp file is left behind."""
    from infer_ctl.provision.remote_files import upload_file

    pc = prov_cluster(1)
    node = pc.cluster.names[0]
    profile = pc.profile()
    local = tmp_path / "big.whl"
    local.write_bytes(bytes(range(256)) * 4001)  # 1 024 256 bytes: 3 parts of 256 KiB + a tail
    prof = load_profile(str(profile))
    sent: list[int] = []
    with Fleet(prof) as fleet:

        def go(conn: Any, _node: Any) -> None:
            put = conn.put_file

            def counting_put(path: str, data: bytes, **kw: Any) -> None:
                sent.append(len(data))
                put(path, data, **kw)

            conn.put_file = counting_put
            conn.run(Command("mkdir", "-p", "/opt/inferctl/wh"), timeout=30)
            upload_file(conn, local, "/opt/inferctl/wh/big.whl", sudo=True, part_bytes=256 * 1024)

        [outcome] = fleet.map(prof.nodes, go)
    assert outcome.error is None, outcome.error
    assert sent == [262144, 262144, 262144, 1024256 - 3 * 262144]
    on = pc.node_path(node, "/opt/inferctl/wh")
    assert (on / "big.whl").read_bytes() == local.read_bytes()
    assert sorted(p.name for p in on.iterdir()) == ["big.whl"]
