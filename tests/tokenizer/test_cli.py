"""`inferctl check tokenizer` end to end through the CLI entry point: table and JSON, exit codes, usage
errors, the missing-extra message, the profile's pair, and the audit family."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from infer_ctl.checks.registry import AuditContext, families
from infer_ctl.cli.main import main
from infer_ctl.core.findings import Status
from infer_ctl.profile import load_profile
from tests.tokenizer.conftest import train_bpe


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """target, an identical draft, and a draft whose eos sits at another id."""
    root = tmp_path_factory.mktemp("cli")
    target = train_bpe(root / "target")
    same = train_bpe(root / "same")
    other = train_bpe(root / "other", specials=("<s>", "<pad>", "</s>", "<|eot|>"))
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg.update(eos_token="</s>", pad_token="<pad>")
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    return target, same, other


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["check", "tokenizer", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_identical_pair_json_document(pair: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    target, same, _ = pair
    code, out, _ = run(capsys, "--target", str(target), "--draft", str(same), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["exit_code"] == 0 and doc["status"] == "ok"
    assert doc["command"] == "check tokenizer" and doc["profile"] is None
    checks = {f["check"] for f in doc["findings"]}
    assert {"tokenizer.vocab", "tokenizer.merges", "tokenizer.special_ids", "tokenizer.probes"} <= checks


def test_moved_eos_fails_with_exit_2_and_a_readable_table(pair: tuple[Path, Path, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    target, _, other = pair
    code, out, _ = run(capsys, "--target", str(target), "--draft", str(other))
    assert code == 2
    assert "FAIL" in out and "eos_token differs" in out and "overall: FAIL" in out


def test_user_probes_file(pair: tuple[Path, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target, _, other = pair
    probes = tmp_path / "mine.txt"
    probes.write_text("plain words\nend </s> here\n\n")
    code, out, _ = run(capsys, "--target", str(target), "--draft", str(other), "--probes", str(probes), "--json")
    mine = [f for f in json.loads(out)["findings"] if f["subject"] == "probes from mine.txt"]
    assert code == 2 and mine[0]["status"] == "fail" and "1 of 2 probe(s)" in mine[0]["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "{t}"], "--target and --draft go together"),
        (["--target", "{t}", "--draft", "/nonexistent/draft"], "--draft /nonexistent/draft: no such directory"),
        (["--target", "{t}", "--draft", "{t}", "--probes", "{bad}"], "not valid JSON"),
        (["--target", "{t}", "--draft", "{t}", "--fleet"], "--fleet checks the profile's model paths"),
        (["--target", "{t}", "--draft", "{t}", "--nodes", "pf-*"], "--nodes/--role select the nodes of --fleet"),
    ],
)
def test_usage_errors_exit_64_with_a_hint(args: list[str], message: str, pair: tuple[Path, Path, Path],
                                          tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[oops")
    code, _, err = run(capsys, *[a.format(t=pair[0], bad=bad) for a in args])
    assert code == 64
    assert message in err and "hint:" in err


def test_missing_extra_says_what_to_install(pair: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now raises ImportError
    code, _, err = run(capsys, "--target", str(pair[0]), "--draft", str(pair[1]))
    assert code == 64
    assert "needs the Python module 'tokenizers'" in err and "pip install 'inferctl[tokenizers]'" in err


def _profile(tmp_path: Path, target: str, draft: str) -> Path:
    data = {
        "name": "tok-test",
        "collocated": True,
        "nodes": [{"name": "pf-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"]}],
        "models": {"target": {"path": target}, "draft": {"path": draft, "algorithm": "EAGLE3"}},
    }
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_pair_from_the_profile(pair: tuple[Path, Path, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, str(pair[0]), str(pair[1]))
    code, out, _ = run(capsys, "-p", str(profile), "--json")
    assert code == 0 and json.loads(out)["profile"] == "tok-test"


def test_profile_paths_not_on_this_machine_are_unknown_with_a_remedy(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, "/models/Llama-3.1-70B-Instruct", "/models/EAGLE3-70B")
    code, out, _ = run(capsys, "-p", str(profile), "--json")
    finding = json.loads(out)["findings"][0]
    assert code == 3 and finding["status"] == "unknown" and "--fleet" in finding["remedy"]


def test_audit_family_runs_on_local_dirs_and_skips_otherwise(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    family = next(f for f in families() if f.name == "tokenizer")
    assert family.needs_nodes is False
    here = load_profile(str(_profile(tmp_path, str(pair[0]), str(pair[2]))))
    findings = family.run(AuditContext(here, None, list(here.nodes)))
    assert any(f.check == "tokenizer.special_ids" and f.status is Status.FAIL for f in findings)
    (tmp_path / "elsewhere").mkdir()
    away = load_profile(str(_profile(tmp_path / "elsewhere", "/models/a", "/models/b")))
    skipped = family.run(AuditContext(away, None, list(away.nodes)))
    assert [f.status for f in skipped] == [Status.SKIP] and "not checked here" in skipped[0].message


def test_profile_without_a_separate_draft_is_skipped(tmp_path: Path) -> None:
    data = {"name": "no-draft", "collocated": True,
            "nodes": [{"name": "pf-01", "host": "127.0.0.1", "connection": "local", "roles": ["prefill"]}],
            "models": {"target": {"path": "/models/t"}, "draft": {"algorithm": "NGRAM"}}}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    family = next(f for f in families() if f.name == "tokenizer")
    prof = load_profile(str(path))
    (finding,) = family.run(AuditContext(prof, None, list(prof.nodes)))
    assert finding.status is Status.SKIP and "NGRAM" in finding.message


def test_audit_family_without_the_extra_is_unknown_with_the_install_hint(
    pair: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    family = next(f for f in families() if f.name == "tokenizer")
    here = load_profile(str(_profile(tmp_path, str(pair[0]), str(pair[1]))))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    (finding,) = family.run(AuditContext(here, None, list(here.nodes)))
    assert finding.status is Status.UNKNOWN and finding.remedy == "pip install 'inferctl[tokenizers]'"
