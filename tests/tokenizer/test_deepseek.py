"""Real DeepSeek tokenizer files: the 0.2.0 (V3.x) vs 0.3.0 (V4) near-miss pair, identical copies, and
mutated copies that must each produce exactly the expected findings (everything else stays OK)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer_ctl.core.findings import Finding, Status
from infer_ctl.core.report import Report
from infer_ctl.core.tokenizer import compare_tokenizers
from infer_ctl.facts.tokenizer.directory import LoadedSide, load_tokenizer_dir
from infer_ctl.facts.tokenizer.encoder import build_encoder
from tests.tokenizer.conftest import V3_CONFIG, replace_once, set_added_flag

EOS = "<｜end▁of▁sentence｜>"


def problems(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.check, f.status.value, f.subject) for f in findings if f.status not in (Status.OK, Status.SKIP)}


@pytest.fixture(scope="module")
def v3_target(tmp_path_factory: pytest.TempPathFactory, ds_v3_dir: Path) -> tuple[LoadedSide, Any]:
    """The V3 tokenizer (+ V3's config.json) loaded once as the target of every mutation (~0.3 s each)."""
    directory = tmp_path_factory.mktemp("v3-target")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(ds_v3_dir / name, directory / name)
    (directory / "config.json").write_text(json.dumps(V3_CONFIG))
    side = load_tokenizer_dir(directory, "target")
    return side, build_encoder(side)


@pytest.fixture
def against_v3(v3_target: tuple[LoadedSide, Any]) -> Callable[[Path], list[Finding]]:
    def run(draft_dir: Path) -> list[Finding]:
        target, enc_t = v3_target
        draft = load_tokenizer_dir(draft_dir, "draft")
        # as compare_dirs does: byte-identical tokenizer.json shares one encoder
        enc_d = enc_t if draft.tokenizer_json == target.tokenizer_json else build_encoder(draft)
        return compare_tokenizers(target.facts, draft.facts, target_encoder=enc_t, draft_encoder=enc_d)
    return run


def test_real_near_miss_pair_v3_vs_v4(ds_v4_dir: Path, against_v3: Callable[[Path], list[Finding]]) -> None:
    findings = against_v3(ds_v4_dir)
    assert problems(findings) == {
        ("tokenizer.vocab", "fail", "id 128798"),
        ("tokenizer.vocab", "warn", "ids only in draft"),
        ("tokenizer.added_tokens", "warn", "id 128805"),
        ("tokenizer.config", "warn", "target vs draft"),  # LlamaTokenizerFast vs PreTrainedTokenizerFast
        ("tokenizer.probes", "fail", "added tokens"),
    }
    by_key = {(f.check, f.subject): f for f in findings}
    moved = by_key[("tokenizer.vocab", "id 128798")]
    assert "'<think>' in the target" in moved.message and "at id 128821" in moved.message
    assert moved.details["same_id_different_token"] == 2  # <think> and </think> moved
    assert by_key[("tokenizer.vocab", "ids only in draft")].details["only_in_draft"] == 465
    assert "'<|EOT|>'" in by_key[("tokenizer.added_tokens", "id 128805")].message
    probe = by_key[("tokenizer.probes", "added tokens")]
    assert "'a <think>'" in probe.message and "128821" in probe.message
    # the base vocabulary really is shared: merges, pipeline and ordinary text agree
    assert by_key[("tokenizer.merges", "target vs draft")].status is Status.OK
    assert by_key[("tokenizer.probes", "built-in corpus")].status is Status.OK
    assert Report("check", None, findings=findings).exit_code == 2


def test_identical_copies_pass(mutated_v3: Callable[..., Path], against_v3: Callable[[Path], list[Finding]]) -> None:
    findings = against_v3(mutated_v3())
    assert problems(findings) == set()
    assert Report("check", None, findings=findings).exit_code == 0
    assert "byte-identical" in findings[0].message


MUTATIONS: dict[str, tuple[dict[str, Any], set[tuple[str, str, str]]]] = {
    "flipped lstrip on eos": (
        {"tokenizer": lambda text: set_added_flag(text, EOS, "lstrip", True)},
        {("tokenizer.added_tokens", "fail", "id 1"), ("tokenizer.probes", "fail", "added tokens")},
    ),
    "different chat template": (
        {"config": lambda cfg: cfg.update(chat_template=cfg["chat_template"].replace("<｜User｜>", "<｜User｜> "))},
        # SGLang renders with the target's template, so a draft template that differs only in a space is a
        # warning (with the rendered diff), not a probe failure: both tokenizers encode the served prompt alike
        {("tokenizer.chat_template", "warn", "target vs draft")},
    ),
    "eos points at another token": (
        {"config": lambda cfg: cfg.update(eos_token="<｜▁pad▁｜>")},
        {("tokenizer.special_ids", "fail", "eos_token")},
    ),
    "add_bos_token flipped": (
        {"config": lambda cfg: cfg.update(add_bos_token=True)},
        {("tokenizer.special_ids", "fail", "add_bos_token")},
    ),
    "special flag only": (
        {"tokenizer": lambda text: set_added_flag(text, "<|EOT|>", "special", False)},
        {("tokenizer.added_tokens", "warn", "id 128805")},
    ),
    "padded vocab": (
        {"model_config": lambda cfg: cfg.update(vocab_size=129536)},
        {("tokenizer.vocab_size", "warn", "target vs draft")},
    ),
    "config vocab smaller than the tokenizer": (
        {"model_config": lambda cfg: cfg.update(vocab_size=128000)},
        {("tokenizer.vocab_size", "fail", "draft")},
    ),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_mutated_copy_gives_exactly_the_expected_findings(
    name: str, mutated_v3: Callable[..., Path], against_v3: Callable[[Path], list[Finding]]
) -> None:
    edits, expected = MUTATIONS[name]
    findings = against_v3(mutated_v3(**edits))
    assert problems(findings) == expected


def test_swapped_ids_fail_with_both_tokens_named(mutated_v3: Callable[..., Path],
                                                 against_v3: Callable[[Path], list[Finding]]) -> None:
    def swap(text: str) -> str:
        text = replace_once(text, '"Hello": 19923,', '"Hello": @@,')
        return replace_once(text, '"Ġquick": 4787,', '"Ġquick": 19923,').replace('"Hello": @@,', '"Hello": 4787,')

    findings = against_v3(mutated_v3(tokenizer=swap))
    assert problems(findings) == {("tokenizer.vocab", "fail", "id 4787"), ("tokenizer.probes", "fail", "built-in corpus")}
    vocab = next(f for f in findings if f.check == "tokenizer.vocab")
    assert vocab.message.startswith("2 id(s) map to different tokens; first: id 4787 is 'Ġquick' in the target, "
                                    "'Hello' in the draft (the draft has 'Ġquick' at id 19923)")
    probe = next(f for f in findings if f.subject == "built-in corpus")
    assert probe.details["examples"][0]["text"] in ("Hello, world!", "The quick brown fox jumps over the lazy dog.")


def test_empty_normalizer_sequence_equals_no_normalizer(mutated_v3: Callable[..., Path],
                                                        against_v3: Callable[[Path], list[Finding]]) -> None:
    """DeepSeek ships `Sequence([])`: dropping it changes nothing, so nothing may be reported."""
    empty = '"normalizer": {\n        "type": "Sequence",\n        "normalizers": []\n    },'
    findings = against_v3(mutated_v3(tokenizer=lambda text: replace_once(text, empty, '"normalizer": null,')))
    assert problems(findings) == set()
