"""Parsers of facts/tokenizer/: merges forms, pipeline canonicalisation, SentencePiece protobuf,
tiktoken ranks, sha256sum output, config/generation files."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from infer_ctl.checks.tokenizer import compare_dirs
from infer_ctl.core.findings import Status
from infer_ctl.facts.tokenizer.directory import load_tokenizer_dir
from infer_ctl.facts.tokenizer.hashes import parse_sha256sum
from infer_ctl.facts.tokenizer.sentencepiece import parse_sentencepiece
from infer_ctl.facts.tokenizer.tiktoken import parse_tiktoken
from infer_ctl.facts.tokenizer.tokenizer_json import canonical_merges, canonical_section
from tests.tokenizer.conftest import train_bpe


def test_old_and_new_merges_forms_are_the_same_merges(tmp_path: Path) -> None:
    new = train_bpe(tmp_path / "new")  # tokenizers >= 0.20 writes ["a", "b"] pairs
    old = shutil.copytree(new, tmp_path / "old")
    doc = json.loads((old / "tokenizer.json").read_text())
    assert isinstance(doc["model"]["merges"][0], list)
    doc["model"]["merges"] = [" ".join(pair) for pair in doc["model"]["merges"]]  # the pre-0.20 form
    (old / "tokenizer.json").write_text(json.dumps(doc))
    assert canonical_merges([["a", "b"]]) == canonical_merges(["a b"]) == ["a b"]
    findings = compare_dirs(new, old)
    assert [f for f in findings if f.status not in (Status.OK, Status.SKIP)] == []


def test_single_and_empty_sequences_are_canonicalised() -> None:
    nfc = {"type": "NFC"}
    assert canonical_section({"type": "Sequence", "normalizers": []}) is None
    assert canonical_section({"type": "Sequence", "normalizers": [nfc]}) == canonical_section(nfc)
    two = {"type": "Sequence", "normalizers": [nfc, {"type": "Lowercase"}]}
    assert canonical_section(two) != canonical_section(nfc)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _varint(number << 3 | wire)
    if wire == 0:
        return key + _varint(int(payload))  # type: ignore[arg-type]
    if wire == 5:
        return key + payload  # type: ignore[operator]
    assert isinstance(payload, bytes)
    return key + _varint(len(payload)) + payload


def sentencepiece_model(pieces: list[tuple[str, float, int]], *, pad_id: int = -1) -> bytes:
    """A ModelProto per sentencepiece_model.proto (field numbers from the .proto file)."""
    body = b"".join(
        _field(1, 2, _field(1, 2, p.encode()) + _field(2, 5, struct.pack("<f", s)) + _field(3, 0, t))
        for p, s, t in pieces
    )
    trainer = _field(3, 0, 2) + _field(40, 0, 0) + _field(41, 0, 1) + _field(42, 0, 2) + _field(43, 0, pad_id)
    normalizer = _field(1, 2, b"nmt_nfkc")
    return body + _field(2, 2, trainer) + _field(3, 2, normalizer)


PIECES = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3), ("▁the", -1.5, 1), ("▁a", -2.0, 1),
          ("<|eot|>", 0.0, 4)]


def test_sentencepiece_protobuf_is_parsed_without_the_library(tmp_path: Path) -> None:
    sp = parse_sentencepiece(sentencepiece_model(PIECES))
    assert sp.pieces == [p for p, _, _ in PIECES] and sp.types == [2, 3, 3, 1, 1, 4]
    assert (sp.model_type, sp.unk_id, sp.bos_id, sp.eos_id, sp.pad_id) == (2, 0, 1, 2, -1)
    (tmp_path / "tokenizer.model").write_bytes(sentencepiece_model(PIECES))
    facts = load_tokenizer_dir(tmp_path, "target").facts
    assert facts.source == "sentencepiece" and facts.model_type == "BPE"
    assert facts.special_tokens["eos_token"] == "</s>" and facts.special_tokens["pad_token"] is None
    assert {t.content for t in facts.added_tokens} == {"<unk>", "<s>", "</s>", "<|eot|>"}


def test_sentencepiece_pair_scores_and_ids_are_compared(tmp_path: Path) -> None:
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    (a / "tokenizer.model").write_bytes(sentencepiece_model(PIECES))
    (b / "tokenizer.model").write_bytes(sentencepiece_model(PIECES))
    rescored = [(p, s - 0.5 if p == "▁a" else s, t) for p, s, t in PIECES]
    (c / "tokenizer.model").write_bytes(sentencepiece_model(rescored))
    same = compare_dirs(a, b)
    assert [f for f in same if f.status not in (Status.OK, Status.SKIP)] == []
    model = next(f for f in compare_dirs(a, c) if f.check == "tokenizer.model")
    assert model.status is Status.FAIL and "scores_sha256" in model.message


def test_tiktoken_ranks_use_the_byte_level_alphabet() -> None:
    vocab = parse_tiktoken("IA== 0\nYQ== 1\nIGE= 3\n")  # b" ", b"a", b" a" (rank 2 unused)
    assert vocab == ["Ġ", "a", None, "Ġa"]


def test_sha256sum_output() -> None:
    digest = "a" * 64
    assert parse_sha256sum(f"{digest}  tokenizer.json\n{digest.upper()} *config.json\nnoise\n") == {
        "tokenizer.json": digest, "config.json": digest}
    assert parse_sha256sum("__inferctl_no_such_directory__\n") is None


@pytest.mark.parametrize(("eos", "expected"), [(7, (7,)), ([7, 9], (7, 9)), (None, ())])
def test_generation_config_eos_int_or_list(tmp_path: Path, eos: object, expected: tuple[int, ...]) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 1000}, "model_type": "x"}))
    facts = load_tokenizer_dir(tmp_path, "draft").facts
    assert facts.generation_eos == expected
    assert facts.config is not None and facts.config.vocab_size == 1000  # multimodal configs nest it
    assert not facts.has_tokenizer


def test_chat_template_file_wins_over_the_config_key(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert load_tokenizer_dir(tmp_path, "t").facts.chat_template == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    facts = load_tokenizer_dir(tmp_path, "t").facts
    assert (facts.chat_template, facts.chat_template_source) == ("J", "chat_template.jinja")


def test_chat_rendering_matches_the_transformers_environment() -> None:
    from infer_ctl.core.tokenizer.chat import TemplateRenderError, render_chat
    from infer_ctl.core.tokenizer.model import TokenizerFacts

    facts = TokenizerFacts("target", "/x", special_tokens={"bos_token": "<s>"})
    skipping = "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}[{{ m.role }}]{% endfor %}"
    assert render_chat(skipping, facts) == "<s>[user][assistant][user]"
    no_system = ("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
                 "{{ messages|length }}")
    assert render_chat(no_system, facts) == "3"  # retried without the system message, as a user would
    with pytest.raises(TemplateRenderError, match="boom"):
        render_chat("{{ raise_exception('boom') }}", facts)


def test_absent_model_keys_equal_the_library_defaults(tmp_path: Path) -> None:
    """Writers differ in which keys they emit (DeepSeek's file has no ignore_merges): absent == default."""
    full = train_bpe(tmp_path / "full")
    sparse = shutil.copytree(full, tmp_path / "sparse")
    doc = json.loads((sparse / "tokenizer.json").read_text())
    for key in ("ignore_merges", "fuse_unk", "byte_fallback", "dropout"):
        doc["model"].pop(key, None)
    (sparse / "tokenizer.json").write_text(json.dumps(doc))
    model = next(f for f in compare_dirs(full, sparse) if f.check == "tokenizer.model")
    assert model.status is Status.OK
    doc["model"]["byte_fallback"] = True
    (sparse / "tokenizer.json").write_text(json.dumps(doc))
    model = next(f for f in compare_dirs(full, sparse) if f.check == "tokenizer.model")
    assert model.status is Status.FAIL and "byte_fallback" in model.message
