"""Inputs a hostile user brings: malformed files of every kind must become findings (never an internal
error or a runaway allocation), and harmless differences must not be failures. Real parts: tokenizers
trained here, real safetensors files (written with safetensors.numpy) and hand-built broken headers."""

from __future__ import annotations

import base64
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from infer_ctl.checks.tokenizer import compare_dirs
from infer_ctl.core.findings import Finding, Status
from tests.tokenizer.conftest import train_bpe


def problems(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.check, f.status.value, f.subject) for f in findings if f.status not in (Status.OK, Status.SKIP)}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = train_bpe(tmp_path_factory.mktemp("target"), nfc=False)
    size = len(json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"])
    (directory / "config.json").write_text(json.dumps({"vocab_size": size, "eos_token_id": 1}))
    return directory


def variant(target: Path, into: Path, edit: Callable[[Path], None]) -> Path:
    shutil.copytree(target, into)
    edit(into)
    return into


def write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        (d / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return edit


def tj(edit: Callable[[dict], None]) -> Callable[[Path], None]:  # type: ignore[type-arg]
    def apply(d: Path) -> None:
        doc = json.loads((d / "tokenizer.json").read_text())
        edit(doc)
        (d / "tokenizer.json").write_text(json.dumps(doc))
    return apply


def header_only(header: object) -> bytes:
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob


MALFORMED: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "added token without id": (tj(lambda d: d["added_tokens"][0].pop("id")), "tokenizer.json", "missing key 'id'"),
    "string token ids": (tj(lambda d: d["model"]["vocab"].update({"a": "7"})), "tokenizer.json", "not an integer"),
    "negative token id": (tj(lambda d: d["model"]["vocab"].update({"a": -1})), "tokenizer.json", "negative"),
    # an id of 10**9 once made the loader allocate an 8 GB list (minutes); it is a corrupt file, reported
    "absurd token id": (tj(lambda d: d["model"]["vocab"].update({"a": 10**9})), "tokenizer.json", "implausibly"),
    "one-element merge": (tj(lambda d: d["model"]["merges"].append(["a"])), "tokenizer.json", "not a tokenizers"),
    "not UTF-8": (write("tokenizer.json", b'{"model": {"\xe9": 1}}'), "tokenizer.json", "not valid JSON"),
    "config vocab_size as text": (write("config.json", '{"vocab_size": "400"}'), "config.json", "not a positive"),
    "eos list with null": (write("config.json", '{"eos_token_id": [null]}'), "config.json", "not integers"),
    "generation eos as text": (write("generation_config.json", '{"eos_token_id": "1"}'), "generation_config.json",
                               "not integers"),
    "safetensors header is a list": (write("model.safetensors", header_only([1, 2])), "model.safetensors",
                                     "not a JSON object of tensor entries"),
    "lm_head without rows": (write("model.safetensors", header_only(
        {"lm_head.weight": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]}}) + b"\0\0"), "model.safetensors",
        "expected [rows, hidden]"),
    "safetensors header cut short": (write("model.safetensors", header_only({"lm_head.weight": {}})[:20]),
                                     "model.safetensors", "truncated"),
    "safetensors header not UTF-8": (write("model.safetensors", struct.pack("<Q", 4) + b"\xff\xfe{x"),
                                     "model.safetensors", "utf-8"),
    "index not JSON": (write("model.safetensors.index.json", "{nope"), "model.safetensors.index.json",
                       "not valid JSON"),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_draft_files_are_one_files_failure(name: str, target: Path, tmp_path: Path) -> None:
    edit, file_name, words = MALFORMED[name]
    findings = compare_dirs(target, variant(target, tmp_path / "draft", edit))
    files = [f for f in findings if f.check == "tokenizer.files" and f.status is Status.FAIL]
    assert [f.subject for f in files] == [f"draft {file_name}"], [f.message for f in findings]
    assert words in files[0].message and files[0].remedy


def test_an_empty_draft_directory_fails_instead_of_passing(target: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    findings = compare_dirs(target, tmp_path / "empty")
    assert problems(findings) == {("tokenizer.files", "fail", "draft")}
    assert "not a model directory" in findings[0].message and "--draft" in (findings[0].remedy or "")


def test_normalized_flag_without_any_normalizer_is_a_warning(target: Path, tmp_path: Path) -> None:
    def flip(doc: dict) -> None:  # type: ignore[type-arg]
        eos = next(t for t in doc["added_tokens"] if t["content"] == "</s>")
        eos["normalized"] = not eos["normalized"]
    findings = compare_dirs(target, variant(target, tmp_path / "draft", tj(flip)))
    assert problems(findings) == {("tokenizer.added_tokens", "warn", "id 1")}
    assert "normalized" in findings[[f.check for f in findings].index("tokenizer.added_tokens")].message


def test_whitespace_only_template_difference_warns_with_a_rendered_diff(target: Path, tmp_path: Path) -> None:
    def spaced(d: Path) -> None:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        cfg["chat_template"] = cfg["chat_template"].replace("}}<|eot|>", "}} <|eot|>")
        (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    findings = compare_dirs(target, variant(target, tmp_path / "draft", spaced))
    assert problems(findings) == {("tokenizer.chat_template", "warn", "target vs draft")}
    warn = next(f for f in findings if f.check == "tokenizer.chat_template")
    assert any(line.startswith("+") and " <|eot|>" in line for line in warn.details["rendered_diff"])


EAGLE_SIZE = 64


def eagle_head(directory: Path, rows: int, d2t: np.ndarray, t2d: np.ndarray, lm_name: str) -> Path:
    directory.mkdir()
    save_file({lm_name: np.zeros((EAGLE_SIZE, 4), np.float16), "d2t": d2t, "t2d": t2d},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"vocab_size": rows, "draft_vocab_size": EAGLE_SIZE,
                                                       "eos_token_id": 1}))
    return directory


@pytest.mark.parametrize("case", ["valid", "prefixed lm_head", "d2t 2-D", "d2t bool", "off by one"])
def test_eagle3_map_shapes_dtypes_and_names(case: str, target: Path, tmp_path: Path) -> None:
    rows = json.loads((target / "config.json").read_text())["vocab_size"]
    hot = np.arange(EAGLE_SIZE, dtype=np.int64)
    d2t = hot - np.arange(EAGLE_SIZE)
    t2d = np.zeros(rows, bool)
    t2d[hot] = True
    lm = "model.lm_head.weight" if case == "prefixed lm_head" else "lm_head.weight"
    if case == "d2t 2-D":
        d2t = d2t.reshape(EAGLE_SIZE, 1)  # SGLang would add arange(64) and broadcast to a 64x64 map
    elif case == "d2t bool":
        d2t = d2t.astype(bool)
    elif case == "off by one":
        d2t = d2t + 1  # every draft id points at the next target id
    findings = compare_dirs(target, eagle_head(tmp_path / "head", rows, d2t, t2d, lm))
    got = problems(findings)
    if case in ("valid", "prefixed lm_head"):
        assert got == set(), [f.message for f in findings]
        sizes = next(f for f in findings if f.check == "tokenizer.vocab_size" and f.subject == "draft")
        assert sizes.details["lm_head_rows"] == EAGLE_SIZE
    else:
        fails = [f.message for f in findings if f.status is Status.FAIL]
        expected = {"d2t 2-D": "shape [64, 1]", "d2t bool": "dtype BOOL", "off by one": "disagree from draft id 0"}
        assert any(expected[case] in m for m in fails), fails


def test_llama3_tiktoken_tokenizer_model_is_read_as_ranks(target: Path, tmp_path: Path) -> None:
    """Meta's original Llama 3 checkpoints ship tiktoken ranks named tokenizer.model (not SentencePiece)."""
    draft = tmp_path / "draft"
    draft.mkdir()
    ranks = [b"a", b"b", b"ab", b" "]
    (draft / "tokenizer.model").write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    findings = compare_dirs(target, draft)
    assert not any(f.check == "tokenizer.files" and f.status is Status.FAIL for f in findings)
    model = next(f for f in findings if f.check == "tokenizer.model")
    assert model.status is Status.WARN and "tiktoken" in model.message
