"""`check tokenizer --fleet` over real OpenSSH servers on loopback (tests/sshd_harness.py).

Real: sshd, the SSH connections, the remote `sh`/`sha256sum`, SFTP fetches, the comparison. The harness
nodes share this machine's filesystem, so a node holding a *drifted* copy is simulated by a stand-in
`sha256sum` on that node's PATH which hashes a different directory (really, with coreutils).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infer_ctl.cli.main import main
from infer_ctl.facts.tokenizer.hashes import parse_sha256sum, tokenizer_hash_command
from tests.sshd_harness import SshCluster
from tests.tokenizer.conftest import train_bpe

pytestmark = pytest.mark.ssh


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fleet-models")
    target = train_bpe(root / "target")
    draft = train_bpe(root / "draft")
    return target, draft


def run_fleet(capsys: pytest.CaptureFixture[str], profile: Path, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["check", "tokenizer", "--fleet", "-p", str(profile), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def statuses(doc: dict, check: str) -> dict[tuple[str, str], str]:  # type: ignore[type-arg]
    return {(f["node"], f["subject"]): f["status"] for f in doc["findings"] if f["check"] == check}


def test_identical_copies_everywhere(ssh_cluster: Callable[..., SshCluster], models: tuple[Path, Path],
                                     tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ssh_cluster(3)
    target, draft = models
    profile = cluster.write_profile(tmp_path / "p.yaml", models={
        "target": {"path": str(target)}, "draft": {"path": str(draft), "algorithm": "EAGLE3"}})
    code, doc = run_fleet(capsys, profile)
    assert code == 0, doc
    fleet = statuses(doc, "tokenizer.fleet")
    assert fleet == {(n, side): "ok" for n in cluster.names for side in ("target", "draft")}
    compared = {f["node"] for f in doc["findings"] if f["check"] == "tokenizer.vocab"}
    assert compared == {"local"}  # this machine's copy has the same bytes, so nothing was downloaded


def test_drifted_node_and_unreachable_node(ssh_cluster: Callable[..., SshCluster], models: tuple[Path, Path],
                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ssh_cluster(3)
    target, draft = models
    drifted = shutil.copytree(target, tmp_path / "drifted-target")
    cfg = json.loads((drifted / "tokenizer_config.json").read_text())
    cfg["eos_token"] = "<|eot|>"
    (drifted / "tokenizer_config.json").write_text(json.dumps(cfg))
    # stand-in: node-03's sha256sum hashes its "own" (drifted) copy of the target directory
    cluster.add_executable("node-03", "sha256sum",
                           f'case "$PWD" in {target}) cd {drifted} ;; esac\nexec /usr/bin/sha256sum "$@"\n')
    cluster.stop("node-02")
    profile = cluster.write_profile(tmp_path / "p.yaml", models={
        "target": {"path": str(target)}, "draft": {"path": str(draft), "algorithm": "EAGLE3"}})
    code, doc = run_fleet(capsys, profile)
    fleet = statuses(doc, "tokenizer.fleet")
    assert fleet[("node-01", "target")] == "ok" and fleet[("node-03", "draft")] == "ok"
    assert fleet[("node-03", "target")] == "fail" and fleet[("node-02", "tokenizer files")] == "unknown"
    drift = next(f for f in doc["findings"] if f["node"] == "node-03" and f["subject"] == "target")
    assert "first: tokenizer_config.json (different bytes)" in drift["message"]
    assert "re-sync" in drift["remedy"]
    assert code == 2


def test_missing_directory_on_the_nodes(ssh_cluster: Callable[..., SshCluster], models: tuple[Path, Path],
                                        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ssh_cluster(2)
    profile = cluster.write_profile(tmp_path / "p.yaml", models={
        "target": {"path": str(models[0])}, "draft": {"path": "/nonexistent/eagle3", "algorithm": "EAGLE3"}})
    code, doc = run_fleet(capsys, profile)
    assert code == 2
    assert statuses(doc, "tokenizer.fleet")[("node-01", "draft")] == "fail"
    assert statuses(doc, "tokenizer.profile") == {("fleet", "models"): "unknown"}


@pytest.fixture
def home_models(models: tuple[Path, Path]) -> Iterator[str]:
    """The models under the (real) home directory, which is where "~/" points on the nodes."""
    rel = f".cache/inferctl-test/fleet-{uuid.uuid4().hex[:8]}"
    # sshd starts sessions in the passwd home, which need not be this process's $HOME
    root = Path(pwd.getpwuid(os.getuid()).pw_dir) / rel
    try:
        root.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot write under the SSH user's home directory: {exc}")
    shutil.copytree(models[0], root / "target")
    shutil.copytree(models[1], root / "draft")
    try:
        yield rel
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_home_relative_paths_are_fetched_from_a_node_when_absent_here(
    ssh_cluster: Callable[..., SshCluster], home_models: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = ssh_cluster(2)
    profile = cluster.write_profile(tmp_path / "p.yaml", models={
        "target": {"path": f"~/{home_models}/target"},
        "draft": {"path": f"~/{home_models}/draft", "algorithm": "EAGLE3"}})
    monkeypatch.setenv("HOME", str(tmp_path / "controller-home"))  # this machine has no copy under ~
    code, doc = run_fleet(capsys, profile)
    assert code == 0, doc
    assert {f["node"] for f in doc["findings"] if f["check"] == "tokenizer.vocab"} == {"node-01"}


def test_hash_command_parser_roundtrip(tmp_path: Path, models: tuple[Path, Path]) -> None:
    """The exact remote script, run by a local sh: hashes parse, a missing directory is None."""
    import subprocess

    ok = subprocess.run(list(tokenizer_hash_command(str(models[0])).argv), capture_output=True, text=True)
    hashes = parse_sha256sum(ok.stdout)
    assert hashes is not None and set(hashes) == {"tokenizer.json", "tokenizer_config.json"}
    missing = subprocess.run(list(tokenizer_hash_command(str(tmp_path / "nope")).argv), capture_output=True, text=True)
    assert parse_sha256sum(missing.stdout) is None
