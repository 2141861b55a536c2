"""EAGLE3 d2t/t2d maps in synthetic draft checkpoints written with the real safetensors library (numpy
flavour), valid and broken; inferctl reads them back with its own header reader (no torch, no numpy)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from infer_ctl.checks.tokenizer import compare_dirs
from infer_ctl.core.findings import Finding, Status
from infer_ctl.facts.tokenizer.safetensors import read_safetensors_header
from infer_ctl.facts.tokenizer.weights import read_weight_facts
from tests.tokenizer.conftest import train_bpe

DRAFT_VOCAB = 64


def problems(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.check, f.status.value, f.subject) for f in findings if f.status not in (Status.OK, Status.SKIP)}


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    directory = train_bpe(tmp_path_factory.mktemp("target"))
    size = len(json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"])
    (directory / "config.json").write_text(json.dumps({"vocab_size": size, "eos_token_id": 1}))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 3]}))  # </s>, <|eot|>
    return directory, size


def hot_ids(size: int) -> np.ndarray:
    """The target ids the draft keeps: the specials 0..3 and an even spread of the rest."""
    rest = np.linspace(4, size - 1, DRAFT_VOCAB - 4).astype(np.int64)
    return np.concatenate([np.arange(4, dtype=np.int64), rest])


def write_draft(directory: Path, size: int, *, hot: np.ndarray | None = None, tensors: dict[str, Any] | None = None,
                config: dict[str, Any] | None = None) -> Path:
    directory.mkdir()
    hot = hot_ids(size) if hot is None else hot
    t2d = np.zeros(size, dtype=bool)
    t2d[hot[hot < size]] = True  # an id beyond the vocabulary cannot be marked
    data = {
        "d2t": (hot - np.arange(len(hot))).astype(np.int64),
        "t2d": t2d,
        "lm_head.weight": np.zeros((len(hot), 4), dtype=np.float16),
        "midlayer.self_attn.q_proj.weight": np.zeros((4, 4), dtype=np.float16),
    }
    data.update(tensors or {})
    save_file({k: v for k, v in data.items() if v is not None}, str(directory / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "vocab_size": size, "draft_vocab_size": len(hot)}
    cfg.update(config or {})
    (directory / "config.json").write_text(json.dumps(cfg))
    return directory


def test_valid_maps_pass_and_are_read_without_torch(target: tuple[Path, int], tmp_path: Path) -> None:
    tdir, size = target
    draft = write_draft(tmp_path / "draft", size)
    facts = read_weight_facts(draft)
    assert facts.lm_head_rows == DRAFT_VOCAB and facts.vocab_map is not None
    assert facts.vocab_map.d2t_dtype == "I64" and facts.vocab_map.t2d_dtype == "BOOL"
    findings = compare_dirs(tdir, draft)
    assert problems(findings) == set()
    subjects = {f.subject for f in findings if f.check == "tokenizer.vocab_map"}
    assert subjects == {"d2t", "t2d", "d2t/t2d", "stop tokens"}


def _swap_first(size: int) -> np.ndarray:
    hot = hot_ids(size)
    hot[[4, 5]] = hot[[5, 4]]
    return hot


BROKEN: dict[str, tuple[dict[str, Any], set[tuple[str, str, str]], str]] = {
    "d2t not increasing": (
        {"hot": "swap"},
        {("tokenizer.vocab_map", "fail", "d2t"), ("tokenizer.vocab_map", "fail", "d2t/t2d")},
        "not strictly increasing at draft id 5",
    ),
    "d2t outside the target vocabulary": (
        {"hot": "overflow"},
        {("tokenizer.vocab_map", "fail", "d2t"), ("tokenizer.vocab_map", "fail", "t2d"),
         ("tokenizer.vocab_map", "fail", "d2t/t2d")},
        "map outside the target vocabulary",
    ),
    "t2d popcount differs": (
        {"tensors": {"t2d": "extra-bit"}},
        {("tokenizer.vocab_map", "fail", "t2d"), ("tokenizer.vocab_map", "fail", "d2t/t2d")},
        "t2d marks 65 target ids but the draft vocabulary has 64",
    ),
    "t2d stored as uint8": (
        {"tensors": {"t2d": "uint8"}},
        {("tokenizer.vocab_map", "fail", "t2d")},
        "t2d has dtype U8; expected BOOL",
    ),
    "eos outside the draft vocabulary": (
        {"hot": "no-eos"},
        {("tokenizer.vocab_map", "fail", "stop tokens")},
        "stop id 1 '</s>'",
    ),
    "draft_vocab_size disagrees with d2t": (
        {"config": {"draft_vocab_size": 32}},
        {("tokenizer.vocab_map", "fail", "d2t"), ("tokenizer.vocab_size", "fail", "draft")},
        "d2t has 64 entries but config.json draft_vocab_size is 32",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_maps_fail_with_the_first_offender(name: str, target: tuple[Path, int], tmp_path: Path) -> None:
    tdir, size = target
    spec, expected, message = BROKEN[name]
    hot = hot_ids(size)
    if spec.get("hot") == "swap":
        hot = _swap_first(size)
    elif spec.get("hot") == "overflow":
        hot[-1] = size + 5
    elif spec.get("hot") == "no-eos":
        hot = np.concatenate([[0], np.arange(2, 4), hot_ids(size)[4:], [size - 2]]).astype(np.int64)
        hot = np.unique(hot)[:DRAFT_VOCAB]
    tensors: dict[str, Any] = {}
    if spec.get("tensors", {}).get("t2d") == "extra-bit":
        t2d = np.zeros(size, dtype=bool)
        t2d[hot] = True
        t2d[np.flatnonzero(~t2d)[0]] = True
        tensors["t2d"] = t2d
    elif spec.get("tensors", {}).get("t2d") == "uint8":
        t2d8 = np.zeros(size, dtype=np.uint8)
        t2d8[hot] = 1
        tensors["t2d"] = t2d8
    draft = write_draft(tmp_path / "draft", size, hot=hot, tensors=tensors, config=spec.get("config"))
    findings = compare_dirs(tdir, draft)
    assert problems(findings) == expected, sorted(problems(findings))
    assert any(message in f.message for f in findings if f.status is Status.FAIL), [f.message for f in findings]


def test_truncated_checkpoint_is_reported_not_raised(target: tuple[Path, int], tmp_path: Path) -> None:
    tdir, size = target
    draft = write_draft(tmp_path / "draft", size)
    path = draft / "model.safetensors"
    header = read_safetensors_header(path)
    begin = header.data_start + header.tensors["t2d"]["data_offsets"][0]
    path.write_bytes(path.read_bytes()[: begin + 10])
    findings = compare_dirs(tdir, draft)
    fails = [f for f in findings if f.status is Status.FAIL]
    assert fails and all(f.check in ("tokenizer.vocab_map", "tokenizer.files") for f in fails)
    assert any("truncated" in f.message for f in fails)


def test_not_a_safetensors_file(tmp_path: Path) -> None:
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    facts = read_weight_facts(tmp_path)
    assert facts.problems and "implausible" in facts.problems[0]


def test_smaller_draft_vocabulary_without_a_map_fails(target: tuple[Path, int], tmp_path: Path) -> None:
    tdir, size = target
    draft = write_draft(tmp_path / "draft", size, tensors={"d2t": None, "t2d": None})
    findings = compare_dirs(tdir, draft)
    assert problems(findings) == {("tokenizer.vocab_map", "fail", "d2t")}
    assert "has no d2t map: draft ids would be taken as target ids" in next(
        f.message for f in findings if f.status is Status.FAIL)


def test_pickled_checkpoint_is_skipped_not_unpickled(target: tuple[Path, int], tmp_path: Path) -> None:
    tdir, size = target
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "pytorch_model.bin").write_bytes(b"not unpickled by inferctl")
    (draft / "config.json").write_text(json.dumps({"vocab_size": size, "draft_vocab_size": DRAFT_VOCAB}))
    findings = compare_dirs(tdir, draft)
    skipped = [f for f in findings if f.check == "tokenizer.vocab_map"]
    assert [f.status for f in skipped] == [Status.SKIP] and "pickled" in skipped[0].message
    assert problems(findings) == set()
