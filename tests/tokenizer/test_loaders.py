"""One loader per file kind (facts/tokenizer/): the error path of each, at the loader (bytes -> the reason)
and through `check tokenizer` (the reason becomes one tokenizer.files failure naming the file, with a
remedy), plus the order in which the tokenizer sources are tried.

The malformed tokenizer.json, config.json, generation eos and safetensors headers that test_malformed_inputs.py
already drives through compare_dirs are not repeated here."""

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
from infer_ctl.core.findings import Status
from infer_ctl.facts.tokenizer.directory import load_tokenizer_dir
from infer_ctl.facts.tokenizer.files import FileProblem
from infer_ctl.facts.tokenizer.generation_config import load_generation_config
from infer_ctl.facts.tokenizer.model_config import model_config
from infer_ctl.facts.tokenizer.safetensors import read_int_tensor, read_safetensors_header
from infer_ctl.facts.tokenizer.sentencepiece import load_sentencepiece
from infer_ctl.facts.tokenizer.tiktoken import load_tiktoken
from infer_ctl.facts.tokenizer.tokenizer_config import (
    load_chat_template,
    load_special_tokens_map,
    load_tokenizer_config,
)
from infer_ctl.facts.tokenizer.tokenizer_json import load_tokenizer_json
from infer_ctl.facts.tokenizer.weights import WeightFacts, read_weight_facts
from tests.tokenizer.conftest import train_bpe
from tests.tokenizer.test_facts import PIECES, _field, sentencepiece_model


def sp_piece(payload: bytes) -> bytes:
    """A ModelProto holding one SentencePiece message with `payload` as its fields."""
    return _field(1, 2, payload)


LOADER_ERRORS: dict[str, tuple[Callable[[bytes], object], bytes, str]] = {
    "tokenizer.json not JSON": (load_tokenizer_json, b"{nope", "not valid JSON"),
    "tokenizer.json a list": (load_tokenizer_json, b"[1]", "not a JSON object"),
    "tokenizer.json model a list": (load_tokenizer_json, b'{"model": [1]}', "not a tokenizers file"),
    "merge neither string nor pair": (load_tokenizer_json, b'{"model": {"type": "BPE", "merges": ["a b", 5]}}',
                                      "not a tokenizers file: merge 5 is neither a string nor a pair"),
    "tokenizer_config not JSON": (load_tokenizer_config, b'{"bos_token": ', "not valid JSON"),
    "tokenizer_config a string": (load_tokenizer_config, b'"x"', "not a JSON object"),
    "AddedToken content not text": (load_tokenizer_config, b'{"eos_token": {"content": 5}}',
                                    "unexpected value: eos_token content 5 is not a string"),
    "special_tokens_map not UTF-8": (load_special_tokens_map, b'{"eos_token": "\xff"}', "not valid JSON"),
    "special_tokens_map content a list": (load_special_tokens_map, b'{"unk_token": {"content": [1]}}',
                                          "unk_token content [1] is not a string"),
    "chat template not UTF-8": (load_chat_template, b"{{ bos_token }}\xff", "not UTF-8 text"),
    "generation_config empty file": (load_generation_config, b"", "not valid JSON"),
    "generation eos a bool": (load_generation_config, b'{"eos_token_id": [true]}',
                              "unexpected value: token id(s) [True] are not integers"),
    "SentencePiece group wire type": (load_sentencepiece, b"\x0b", "unsupported protobuf wire type 3"),
    "SentencePiece truncated varint": (load_sentencepiece, b"\x08\x80", "not a SentencePiece model"),
    "SentencePiece truncated score": (load_sentencepiece, sp_piece(_field(1, 2, b"a") + b"\x15\x00\x00"),
                                      "not a SentencePiece model: unpack requires a buffer of 4 bytes"),
    "SentencePiece piece not UTF-8": (load_sentencepiece, sp_piece(_field(1, 2, b"\xff")),
                                      "not a SentencePiece model: 'utf-8' codec can't decode"),
    "tiktoken three fields": (load_tiktoken, b"YQ== 0 x\n", "not a tiktoken rank file"),
    "tiktoken bad base64": (load_tiktoken, b"Y 0\n", "not a tiktoken rank file"),
    "tiktoken rank not a number": (load_tiktoken, b"YQ== one\n", "not a tiktoken rank file"),
    "tiktoken negative rank": (load_tiktoken, b"YQ== 0\nYg== -1\n", "negative token id -1"),
    "tiktoken absurd rank": (load_tiktoken, b"YQ== 1000000000\n", "implausibly large"),
    "tiktoken not UTF-8": (load_tiktoken, b"YQ== 0\n\xff 1\n", "not a tiktoken rank file"),
}


@pytest.mark.parametrize("name", list(LOADER_ERRORS))
def test_each_loader_names_what_is_wrong(name: str) -> None:
    load, data, words = LOADER_ERRORS[name]
    with pytest.raises(FileProblem) as caught:
        load(data)
    assert words in str(caught.value)


def test_valid_files_load_to_typed_facts() -> None:
    config = load_tokenizer_config(json.dumps({
        "bos_token": {"content": "<s>", "lstrip": False}, "eos_token": "</s>", "pad_token": None,
        "add_bos_token": 1, "tokenizer_class": "LlamaTokenizerFast", "legacy": False,
        "chat_template": [{"name": "rag", "template": "R"}, {"name": "default", "template": "D"}]}).encode())
    assert dict(config.special_tokens) == {"bos_token": "<s>", "eos_token": "</s>", "pad_token": None}
    assert (config.add_bos_token, config.add_eos_token) == (True, None)
    assert (config.tokenizer_class, dict(config.flags), config.chat_template) == ("LlamaTokenizerFast",
                                                                                  {"legacy": False}, "D")
    generation = load_generation_config(b'{"eos_token_id": [1, 9], "bos_token_id": 0}')
    assert generation is not None and generation.eos_token_id == (1, 9)
    assert load_generation_config(b"{}") is None  # an empty file says nothing, as if it were absent
    assert load_tokenizer_json(b"{}") is None
    assert load_tiktoken(b"YQ== 1\n") == [None, "a"]
    assert load_sentencepiece(sentencepiece_model(PIECES)).pieces[3] == "▁the"


@pytest.mark.parametrize(("doc", "words"), [
    ({"vocab_size": 0}, "vocab_size 0 is not a positive integer"),
    ({"draft_vocab_size": True}, "draft_vocab_size True is not a positive integer"),
    ({"text_config": {"eos_token_id": [1, "2"]}}, "are not integers"),  # nested keys are checked too
])
def test_model_config_values_are_checked(doc: dict[str, object], words: str) -> None:
    with pytest.raises(FileProblem, match="unexpected value") as caught:
        model_config(doc, WeightFacts())
    assert words in str(caught.value)


# ---------------------------------------------------------------- the same reasons, as findings


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe(tmp_path_factory.mktemp("target"))


def sp_draft(d: Path) -> None:
    """Replace the tokenizer with a truncated SentencePiece model (the score of one piece cut short)."""
    (d / "tokenizer.json").unlink()
    (d / "tokenizer.model").write_bytes(sp_piece(_field(1, 2, b"a") + b"\x15\x00\x00"))


def tiktoken_draft(d: Path) -> None:
    (d / "tokenizer.json").unlink()
    (d / "cl100k_base.tiktoken").write_bytes(b"YQ== 0\nYg== 4000000000\n")


def write(name: str, data: bytes) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        (d / name).write_bytes(data)
    return edit


FILE_FINDINGS: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "tokenizer_config.json a list": (write("tokenizer_config.json", b"[]"), "tokenizer_config.json",
                                     "not a JSON object"),
    "special_tokens_map.json not JSON": (write("special_tokens_map.json", b"{eos}"), "special_tokens_map.json",
                                         "not valid JSON"),
    "AddedToken content a number": (write("special_tokens_map.json", b'{"unk_token": {"content": 0}}'),
                                    "special_tokens_map.json", "unk_token content 0 is not a string"),
    "chat_template.jinja not UTF-8": (write("chat_template.jinja", b"\xfe\xff{{ x }}"), "chat_template.jinja",
                                      "not UTF-8 text"),
    "generation_config.json not JSON": (write("generation_config.json", b"eos=1"), "generation_config.json",
                                        "not valid JSON"),
    "SentencePiece model cut short": (sp_draft, "tokenizer.model", "not a SentencePiece model"),
    "tiktoken rank absurd": (tiktoken_draft, "cl100k_base.tiktoken", "implausibly large"),
    "index names a missing shard": (write("model.safetensors.index.json", b'{"weight_map": {"x": "gone.safetensors"}}'),
                                    "gone.safetensors", "No such file"),
    "index without weight_map": (write("model.safetensors.index.json", b'{"metadata": {}}'),
                                 "model.safetensors.index.json", "no weight_map object"),
    "safetensors shorter than its length": (write("model.safetensors", b"\x01\x00"), "model.safetensors",
                                            "file shorter than the 8-byte header length"),
}


@pytest.mark.parametrize("name", list(FILE_FINDINGS))
def test_malformed_file_is_one_files_failure_naming_it(name: str, target: Path, tmp_path: Path) -> None:
    edit, file_name, words = FILE_FINDINGS[name]
    draft = shutil.copytree(target, tmp_path / "draft")
    edit(draft)
    findings = compare_dirs(target, draft)
    files = [f for f in findings if f.check == "tokenizer.files" and f.status is Status.FAIL]
    assert [f.subject for f in files] == [f"draft {file_name}"], [f.message for f in findings]
    assert words in files[0].message and files[0].remedy


def header_only(header: object, data: bytes = b"") -> bytes:
    blob = json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


@pytest.mark.parametrize(("entry", "words"), [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "tensor d2t has dtype F32; expected an integer"),
    ({"shape": [2], "data_offsets": [0, 16]}, "tensor d2t: missing key 'dtype'"),
    ({"dtype": "I64", "shape": [3], "data_offsets": [0, 16]}, "tensor d2t: 16 bytes for shape [3] of I64"),
    ({"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}, "tensor d2t is truncated"),
])
def test_unreadable_d2t_is_one_vocab_map_failure(entry: dict[str, object], words: str, target: Path,
                                                 tmp_path: Path) -> None:
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "model.safetensors").write_bytes(header_only({"d2t": entry}, b"\0" * 8))
    (draft / "config.json").write_text(json.dumps({"vocab_size": 400, "draft_vocab_size": 2}))
    weights = read_weight_facts(draft)
    assert weights.vocab_map is not None and weights.vocab_map.d2t is None
    assert [p.startswith("model.safetensors: ") and words in p for p in weights.vocab_map.problems] == [True]
    findings = compare_dirs(target, draft)
    fails = [f for f in findings if f.status is Status.FAIL]
    # reported once, by the vocabulary-map rule (with its remedy), not again as tokenizer.files
    assert [f.check for f in fails if words in f.message] == ["tokenizer.vocab_map"], [f.message for f in fails]
    assert not any(f.check == "tokenizer.files" for f in fails)


def test_int_tensor_is_read_with_its_shape_and_dtype(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"t2d": np.array([True, False, True]), "d2t": np.array([[5, -1]], np.int32)}, str(path))
    header = read_safetensors_header(path)
    d2t, t2d = read_int_tensor(path, header, "d2t"), read_int_tensor(path, header, "t2d")
    assert (d2t.dtype, d2t.shape, d2t.values) == ("I32", (1, 2), [5, -1])
    assert (t2d.dtype, t2d.shape, t2d.values) == ("BOOL", (3,), [1, 0, 1])


# ---------------------------------------------------------------- which file defines the tokenizer


def test_a_broken_tokenizer_json_falls_back_to_the_sentencepiece_model(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": -1}}}')
    (tmp_path / "tokenizer.model").write_bytes(sentencepiece_model(PIECES))
    side = load_tokenizer_dir(tmp_path, "draft")
    assert side.facts.source == "sentencepiece" and side.tokenizer_json is None
    assert list(side.facts.problems) == ["tokenizer.json"] and "negative" in side.facts.problems["tokenizer.json"]


def test_an_empty_tokenizer_json_is_no_tokenizer_not_a_problem(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "r.tiktoken").write_text(f"{base64.b64encode(b'a').decode()} 0\n")
    facts = load_tokenizer_dir(tmp_path, "draft").facts
    assert (facts.source, facts.vocab, dict(facts.problems)) == ("tiktoken", ["a"], {})


def test_a_broken_tokenizer_model_ends_the_search(tmp_path: Path) -> None:
    """A slow tokenizer would load tokenizer.model, not a *.tiktoken beside it: report it, do not guess."""
    (tmp_path / "tokenizer.model").write_bytes(b"\x0b")
    (tmp_path / "r.tiktoken").write_text(f"{base64.b64encode(b'a').decode()} 0\n")
    facts = load_tokenizer_dir(tmp_path, "draft").facts
    assert facts.source is None and list(facts.problems) == ["tokenizer.model"]


def test_problems_are_listed_in_reading_order(tmp_path: Path) -> None:
    for name, data in (("config.json", b"[]"), ("tokenizer.json", b"{"), ("generation_config.json", b"{"),
                       ("tokenizer_config.json", b"{"), ("model.safetensors", b"\0")):
        (tmp_path / name).write_bytes(data)
    problems = load_tokenizer_dir(tmp_path, "draft").facts.problems
    assert list(problems) == ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json",
                              "model.safetensors"]
