"""`inferctl profile init`: a commented first profile from a few flags that passes
`profile validate`, written atomically, never over an existing file without --force."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ctl.atomicfile import write_atomic
from infer_ctl.cli.main import main
from infer_ctl.profile import load_profile

ROOT = Path(__file__).resolve().parents[2]
PD = ["--prefill", "pf-01=10.0.0.11", "--decode", "dc-01=10.0.0.21", "--decode", "10.0.0.22"]


def test_init_writes_a_commented_profile_that_validates(tmp_path: Path) -> None:
    out = tmp_path / "inferctl.yaml"
    assert main(["profile", "init", *PD, "--gpus", "4", "--model", "/models/m", "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# inferctl cluster profile") and "# draft:" in text
    assert main(["profile", "validate", "-p", str(out)]) == 0
    prof = load_profile(str(out))
    assert [(n.name, n.host, [r.value for r in n.roles], n.gpus) for n in prof.nodes] == [
        ("pf-01", "10.0.0.11", ["prefill"], 4), ("dc-01", "10.0.0.21", ["decode"], 4),
        ("dc-02", "10.0.0.22", ["decode"], 4)]
    assert prof.models is not None and (prof.models.target.path, prof.models.target.tp) == ("/models/m", 4)
    assert not prof.collocated
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inferctl.yaml"]  # no temp file left behind


def test_init_collocated(tmp_path: Path) -> None:
    out = tmp_path / "p.yaml"
    assert main(["profile", "init", "--mixed", "box-01=10.0.1.5", "--tp", "2", "--out", str(out)]) == 0
    assert main(["profile", "validate", "-p", str(out)]) == 0
    prof = load_profile(str(out))
    assert prof.collocated and prof.models is not None and prof.models.target.tp == 2


@pytest.mark.parametrize("shape", [PD, ["--mixed", "box-01=10.0.1.5"]])
def test_init_without_gpus_writes_cpu_servers_that_validate(tmp_path: Path, shape: list[str]) -> None:
    # --gpus 0 is in the option's range: the profile must not be one validate refuses (GPU ranks, no GPU)
    out = tmp_path / "p.yaml"
    assert main(["profile", "init", *shape, "--gpus", "0", "--out", str(out)]) == 0
    assert main(["profile", "validate", "-p", str(out)]) == 0
    prof = load_profile(str(out))
    roles = ["collocated"] if prof.collocated else ["prefill", "decode"]
    assert all(getattr(prof.sglang.extra_args, r) == ["--device", "cpu"] for r in roles)


def test_init_refuses_to_replace_a_file_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "inferctl.yaml"
    out.write_text("mine\n")
    assert main(["profile", "init", *PD, "--out", str(out)]) == 64
    assert "--force" in capsys.readouterr().err
    assert out.read_text() == "mine\n"
    assert main(["profile", "init", *PD, "--out", str(out), "--force"]) == 0
    assert main(["profile", "validate", "-p", str(out)]) == 0


def test_init_to_stdout_through_a_pipe_validates(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("INFERCTL_PROFILE", None)
    cmd = f"{sys.executable} -m infer_ctl profile init --mixed 10.0.1.5 --out - | cat > piped.yaml"
    subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, check=True)
    done = subprocess.run([sys.executable, "-m", "infer_ctl", "profile", "validate", "-p", "piped.yaml"],
                          cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--prefill", "10.0.0.1"], "no --decode node"),
        (["--mixed", "10.0.0.1", "--decode", "10.0.0.2"], "cannot be combined"),
        ([], "no nodes given"),
        (["--prefill", "a b=10.0.0.1", "--decode", "10.0.0.2"], "nodes[0].name"),
    ],
)
def test_init_refuses_a_cluster_it_cannot_describe(argv: list[str], says: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "init", *argv, "--out", str(tmp_path / "x.yaml")]) == 64
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_exclusive_atomic_write_never_replaces(tmp_path: Path) -> None:
    target = tmp_path / "f"
    write_atomic(target, "one", exclusive=True)
    with pytest.raises(FileExistsError):
        write_atomic(target, "two", exclusive=True)
    assert target.read_text() == "one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
