"""Tiny tokenizers trained here with the tokenizers library: byte-level BPE and SentencePiece-style
Unigram (Metaspace), plus tiktoken rank files and a draft directory without any tokenizer."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from infer_ctl.checks.tokenizer import compare_dirs
from infer_ctl.core.findings import Finding, Status
from tests.tokenizer.conftest import CORPUS, train_bpe, train_unigram


def problems(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.check, f.status.value, f.subject) for f in findings if f.status not in (Status.OK, Status.SKIP)}


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("bpe"))


def copy_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, ensure_ascii=False))


def test_independently_trained_identical_bpe_pass(bpe_dir: Path, tmp_path: Path) -> None:
    again = train_bpe(tmp_path / "again")
    findings = compare_dirs(bpe_dir, again)
    assert problems(findings) == set()
    assert {f.subject for f in findings if f.check == "tokenizer.probes"} >= {"built-in corpus", "added tokens",
                                                                             "chat conversation"}


def test_removed_nfc_normalizer_is_caught_by_rule_and_by_the_nfd_probe(bpe_dir: Path, tmp_path: Path) -> None:
    draft = copy_dir(bpe_dir, tmp_path / "draft")
    edit_json(draft / "tokenizer.json", lambda doc: doc.update(normalizer=None))
    findings = compare_dirs(bpe_dir, draft)
    assert problems(findings) == {("tokenizer.normalizer", "fail", "target vs draft"),
                                  ("tokenizer.probes", "fail", "built-in corpus")}
    probe = next(f for f in findings if f.subject == "built-in corpus")
    assert probe.details["examples"][0]["text"] == "cafe\u0301"


def test_tokenizers_trained_on_different_text_differ_in_vocab_and_merges(bpe_dir: Path, tmp_path: Path) -> None:
    other = train_bpe(tmp_path / "other", corpus=[s.upper() for s in CORPUS])
    findings = compare_dirs(bpe_dir, other)
    found = problems(findings)
    assert ("tokenizer.merges", "fail", next(f.subject for f in findings if f.check == "tokenizer.merges")) in found
    assert any(c == "tokenizer.vocab" and s == "fail" for c, s, _ in found)
    merges = next(f for f in findings if f.check == "tokenizer.merges")
    assert "first difference at rank" in merges.message


def test_bpe_vs_unigram_is_a_model_failure(bpe_dir: Path, tmp_path: Path) -> None:
    findings = compare_dirs(bpe_dir, train_unigram(tmp_path / "uni"))
    model = next(f for f in findings if f.check == "tokenizer.model")
    assert model.status is Status.FAIL and "target BPE" in model.message and "draft Unigram" in model.message


def test_sentencepiece_style_unigram_score_change_is_caught(tmp_path: Path) -> None:
    target = train_unigram(tmp_path / "t")
    draft = copy_dir(target, tmp_path / "d")
    assert problems(compare_dirs(target, draft)) == set()

    def bump(doc: dict) -> None:  # type: ignore[type-arg]
        doc["model"]["vocab"][10][1] += 3.0
    edit_json(draft / "tokenizer.json", bump)
    findings = compare_dirs(target, draft)
    model = next(f for f in findings if f.check == "tokenizer.model")
    assert model.status is Status.FAIL and "scores_sha256" in model.message


def test_embedded_padding_is_reported_and_does_not_hide_probe_results(bpe_dir: Path, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    draft = copy_dir(bpe_dir, tmp_path / "draft")
    tok = Tokenizer.from_file(str(draft / "tokenizer.json"))
    tok.enable_padding(length=64, pad_id=2, pad_token="<pad>")
    tok.save(str(draft / "tokenizer.json"))
    findings = compare_dirs(bpe_dir, draft)
    assert problems(findings) == {("tokenizer.padding", "warn", "draft")}


def test_draft_without_tokenizer_uses_the_targets_and_still_checks_sizes(bpe_dir: Path, tmp_path: Path) -> None:
    head = tmp_path / "eagle-head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": 100}))
    findings = compare_dirs(bpe_dir, head)
    assert findings[0].status is Status.OK and "uses the target's" in findings[0].message
    assert problems(findings) == {("tokenizer.vocab_size", "fail", "draft")}
    assert "beyond the draft's 100 embedding rows" in next(f for f in findings if f.status is Status.FAIL).message


def test_target_without_tokenizer_fails_with_a_remedy(bpe_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    findings = compare_dirs(empty, bpe_dir)
    assert [(f.check, f.status) for f in findings] == [("tokenizer.files", Status.FAIL)]
    assert findings[0].remedy and "tokenizer_path" in findings[0].remedy


def test_corrupt_tokenizer_json_is_a_failure_not_a_traceback(bpe_dir: Path, tmp_path: Path) -> None:
    draft = copy_dir(bpe_dir, tmp_path / "draft")
    (draft / "tokenizer_config.json").write_text("{not json")
    findings = compare_dirs(bpe_dir, draft)
    bad = [f for f in findings if f.status is Status.FAIL]
    assert [(f.check, f.subject) for f in bad] == [("tokenizer.files", "draft tokenizer_config.json")]
    assert "not valid JSON" in bad[0].message


def _write_tiktoken(directory: Path, vocab: dict[bytes, int]) -> Path:
    directory.mkdir()
    lines = [f"{base64.b64encode(tok).decode()} {rank}" for tok, rank in sorted(vocab.items(), key=lambda x: x[1])]
    (directory / "tiny.tiktoken").write_text("\n".join(lines) + "\n")
    return directory


def test_tiktoken_rank_files_compare_by_vocabulary_and_skip_probes(tmp_path: Path) -> None:
    ranks = {bytes([b]): b for b in range(256)} | {b"th": 256, b"the": 257, b" the": 258}
    target = _write_tiktoken(tmp_path / "t", ranks)
    same = _write_tiktoken(tmp_path / "same", ranks)
    findings = compare_dirs(target, same)
    assert problems(findings) == set()
    assert any(f.status is Status.SKIP and "probes need tokenizer.json" in f.message for f in findings)
    swapped = _write_tiktoken(tmp_path / "swapped", ranks | {b"the": 258, b" the": 257})
    vocab = next(f for f in compare_dirs(target, swapped) if f.check == "tokenizer.vocab")
    assert vocab.status is Status.FAIL and vocab.subject == "id 257"
    assert "'the'" in vocab.message and "'Ġthe'" in vocab.message  # byte-level spelling, as in tokenizer.json


def test_tokenizer_json_the_library_refuses_is_a_failure_and_probes_are_skipped(bpe_dir: Path, tmp_path: Path) -> None:
    draft = copy_dir(bpe_dir, tmp_path / "draft")
    edit_json(draft / "tokenizer.json", lambda doc: doc["model"]["merges"].append(["zz-unknown", "qq-unknown"]))
    findings = compare_dirs(bpe_dir, draft)
    refused = [f for f in findings if f.check == "tokenizer.files" and f.status is Status.FAIL]
    assert len(refused) == 1 and "cannot load it" in refused[0].message and "zz-unknown" in refused[0].message
    skipped = [f for f in findings if f.check == "tokenizer.probes"]
    assert [f.status for f in skipped] == [Status.SKIP] and "could not be loaded" in skipped[0].message


def test_eagle_head_config_naming_other_ids_is_a_warning(bpe_dir: Path, tmp_path: Path) -> None:
    head = tmp_path / "eagle-head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"vocab_size": 400, "bos_token_id": 0, "eos_token_id": [1, 7]}))
    findings = compare_dirs(bpe_dir, head)
    warn = [f for f in findings if f.status is Status.WARN]
    assert [(f.check, f.subject) for f in warn] == [("tokenizer.config_ids", "draft config.json")]
    assert "eos_token_id [7] is not a stop id of the target ([1])" in warn[0].message
    (head / "config.json").write_text(json.dumps({"vocab_size": 400, "bos_token_id": 0, "eos_token_id": 1}))
    assert problems(compare_dirs(bpe_dir, head)) == set()


def test_differing_tokenizer_model_beside_identical_tokenizer_json_is_a_warning(bpe_dir: Path, tmp_path: Path) -> None:
    target = copy_dir(bpe_dir, tmp_path / "t")
    draft = copy_dir(bpe_dir, tmp_path / "d")
    (target / "tokenizer.model").write_bytes(b"\x0a\x03one")
    (draft / "tokenizer.model").write_bytes(b"\x0a\x03two")
    assert problems(compare_dirs(target, draft)) == {("tokenizer.files", "warn", "tokenizer.model")}
