"""tokenizer.json (the `tokenizers` library's file) -> the parts the comparison needs, canonicalised.

Parsed with the JSON parser, never the library: the library only builds the encoder for probes
(`encoder.py`). Format: https://github.com/huggingface/tokenizers (tokenizers/src/tokenizer/serialization.rs
and models/*/serialization.rs, 0.20+).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from infer_ctl.core.tokenizer.model import AddedTokenFacts
from infer_ctl.facts.tokenizer.files import SHAPE_ERRORS, FileProblem, sha256_bytes, why
from infer_ctl.facts.tokenizer.jsonfile import JsonObject, canonical_json, parse_json_object

PIPELINE_SECTIONS = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
#: model settings that change how a BPE/Unigram/WordPiece model splits text
MODEL_SETTINGS = (
    "dropout",
    "unk_token",
    "continuing_subword_prefix",
    "end_of_word_suffix",
    "fuse_unk",
    "byte_fallback",
    "ignore_merges",
    "unk_id",
    "max_input_chars_per_word",
)
# The tokenizers library's defaults: a key left out of tokenizer.json means the default, so "absent" and
# "default" must compare equal (writers differ in which keys they emit).
MODEL_DEFAULTS: dict[str, dict[str, object]] = {
    "BPE": {"dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
    "WordPiece": {"unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100},
    "WordLevel": {"unk_token": None},
    "Unigram": {"unk_id": None, "byte_fallback": False},
}
# The largest real vocabularies have ~262k ids; an id far beyond that is a corrupt file, and building an
# id-indexed list for it would allocate gigabytes (an id of 10**9 took minutes and 8 GB before this bound).
MAX_TOKEN_ID = 1 << 22

_SEQUENCE_KEYS = ("normalizers", "pretokenizers", "processors", "decoders")


def canonical_section(value: object) -> str | None:
    """A pipeline section as canonical JSON; a Sequence of nothing is no section, a Sequence of one is that
    one (they behave identically, and writers differ in which form they emit)."""
    if isinstance(value, dict) and value.get("type") == "Sequence":
        items = next((value[k] for k in _SEQUENCE_KEYS if k in value), None)
        if isinstance(items, list) and len(items) <= 1:
            return canonical_section(items[0]) if items else None
    return canonical_json(value)


def canonical_merges(raw: Sequence[object]) -> list[str]:
    """Old files store merges as "a b" strings, tokenizers >= 0.20 writes ["a", "b"] pairs: one form."""
    if raw and not isinstance(raw[0], str):
        return [f"{a} {b}" for a, b in cast("Sequence[Sequence[object]]", raw)]
    if set(map(type, raw)) - {str}:  # C-speed over ~127k merges
        bad = next(m for m in raw if not isinstance(m, str))
        raise ValueError(f"merge {bad!r} is neither a string nor a pair")
    return cast("list[str]", list(raw))


def check_ids(ids: Sequence[object]) -> None:
    """Ids must be small non-negative integers; anything else is a corrupt file, reported as such."""
    if not ids:
        return
    if set(map(type, ids)) != {int}:  # C-speed over 129k ids; bool/float/str ids are corrupt
        bad = next(i for i in ids if type(i) is not int)
        raise ValueError(f"token id {bad!r} is not an integer")
    ints = cast("Sequence[int]", ids)  # every element is an int: checked just above
    low, high = min(ints), max(ints)
    if low < 0:
        raise ValueError(f"negative token id {low}")
    if high > MAX_TOKEN_ID:
        raise ValueError(f"token id {high} is implausibly large (over {MAX_TOKEN_ID})")


@dataclass(frozen=True)
class TokenizerJson:
    """The parts of tokenizer.json the comparison needs, canonicalised."""

    model_type: str | None
    model_settings: dict[str, object]
    vocab: list[str | None]
    merges: list[str]
    merges_sha256: str | None
    added_tokens: list[AddedTokenFacts]
    pipeline: dict[str, str | None]
    padding: str | None
    truncation: str | None


def _added_token(t: JsonObject) -> AddedTokenFacts:
    return AddedTokenFacts(
        id=int(t["id"]),
        content=str(t["content"]),
        special=bool(t.get("special", False)),
        normalized=bool(t.get("normalized", True)),
        lstrip=bool(t.get("lstrip", False)),
        rstrip=bool(t.get("rstrip", False)),
        single_word=bool(t.get("single_word", False)),
    )


def _vocab_by_id(raw_vocab: object, added_ids: list[int]) -> list[str | None]:
    """The model's vocabulary as an id-indexed list (None marks an unused id), built without per-entry
    conversions: this runs over ~129k entries."""
    if isinstance(raw_vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        values = list(raw_vocab.values())
        if values == list(range(len(values))):
            # writers store the vocabulary in id order: the ids are sound and no per-entry loop is needed
            check_ids(added_ids)
            return list(raw_vocab)
        check_ids(added_ids + values)
        vocab: list[str | None] = [None] * (max(values, default=-1) + 1)
        for tok, i in raw_vocab.items():
            vocab[i] = tok
        return vocab
    check_ids(added_ids)
    if isinstance(raw_vocab, list):  # Unigram: [[token, score], ...] in id order
        return [str(entry[0]) for entry in raw_vocab]
    return []


def parse_tokenizer_json(doc: JsonObject) -> TokenizerJson:
    model = doc.get("model") or {}
    raw_type = model.get("type")
    model_type = None if raw_type is None else str(raw_type)
    raw_vocab = model.get("vocab")
    added = [_added_token(t) for t in doc.get("added_tokens") or ()]
    vocab = _vocab_by_id(raw_vocab, [t.id for t in added])
    for t in added:  # an added token overrides a model token with the same id, as in the library
        if t.id >= len(vocab):
            vocab.extend([None] * (t.id + 1 - len(vocab)))
        vocab[t.id] = t.content
    defaults = MODEL_DEFAULTS.get(str(model_type), {})
    # defaults filled in: a key left out equals its default, and messages show "False -> True", not "None"
    settings: dict[str, object] = {
        k: model.get(k, defaults.get(k)) for k in MODEL_SETTINGS if k in model or k in defaults}
    merges: list[str] = []
    merges_sha: str | None = None
    if model_type == "BPE":
        merges = canonical_merges(model.get("merges") or [])
        merges_sha = sha256_bytes("\n".join(merges).encode())
    elif model_type == "Unigram" and isinstance(raw_vocab, list):
        # Unigram splits by score: a changed score changes encodings like a changed merge would.
        scores = "\n".join(repr(float(entry[1])) for entry in raw_vocab)
        settings["scores_sha256"] = sha256_bytes(scores.encode())
    return TokenizerJson(
        model_type=model_type,
        model_settings=settings,
        vocab=vocab,
        merges=merges,
        merges_sha256=merges_sha,
        added_tokens=added,
        pipeline={name: canonical_section(doc.get(name)) for name in PIPELINE_SECTIONS},
        padding=canonical_json(doc.get("padding")),
        truncation=canonical_json(doc.get("truncation")),
    )


def load_tokenizer_json(data: bytes) -> TokenizerJson | None:
    """The file's facts; None for an empty object (no tokenizer here: the other sources are tried)."""
    doc = parse_json_object(data)
    if not doc:
        return None
    try:
        return parse_tokenizer_json(doc)
    except SHAPE_ERRORS as exc:
        raise FileProblem(f"not a tokenizers file: {why(exc)}") from exc
