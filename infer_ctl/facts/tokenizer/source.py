"""The tokenizer proper (vocabulary, model, added tokens, pipeline) from whichever file defines it:
tokenizer.json first (what SGLang's fast tokenizer loads), else `tokenizer.model` (tiktoken ranks or a
SentencePiece model), else the first `*.tiktoken`.

A tokenizer.json that cannot be used is reported and the next source is tried, so the comparison still
knows the vocabulary a slow tokenizer would load; a broken `tokenizer.model` is reported and ends the search.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from infer_ctl.core.tokenizer.model import AddedTokenFacts
from infer_ctl.facts.tokenizer.files import FileProblem, RawFiles, attempt
from infer_ctl.facts.tokenizer.sentencepiece import MODEL_TYPES, SentencePieceModel, load_sentencepiece
from infer_ctl.facts.tokenizer.tiktoken import load_tiktoken, looks_like_tiktoken
from infer_ctl.facts.tokenizer.tokenizer_json import TokenizerJson, load_tokenizer_json


@dataclass(frozen=True)
class TokenizerSource:
    """The `TokenizerFacts` fields one tokenizer file defines (defaults: what that kind of file lacks)."""

    #: "tokenizer.json", "tiktoken" or "sentencepiece"; None: the directory has no tokenizer
    source: str | None
    model_type: str | None
    model_settings: Mapping[str, object] = field(default_factory=dict)
    vocab: Sequence[str | None] = ()
    merges: Sequence[str] = ()
    merges_sha256: str | None = None
    added_tokens: Sequence[AddedTokenFacts] = ()
    pipeline: Mapping[str, str | None] = field(default_factory=dict)
    padding: str | None = None
    truncation: str | None = None
    #: special tokens the file itself names (SentencePiece ids); tokenizer_config.json overrides them
    special_tokens: Mapping[str, str | None] = field(default_factory=dict)
    #: tokenizer.json text, kept so the encoder is built without reading the file again
    tokenizer_json: str | None = None


def from_tokenizer_json(tj: TokenizerJson, text: str) -> TokenizerSource:
    return TokenizerSource(
        source="tokenizer.json",
        model_type=tj.model_type,
        model_settings=tj.model_settings,
        vocab=tj.vocab,
        merges=tj.merges,
        merges_sha256=tj.merges_sha256,
        added_tokens=tj.added_tokens,
        pipeline=tj.pipeline,
        padding=tj.padding,
        truncation=tj.truncation,
        tokenizer_json=text,
    )


def from_sentencepiece(sp: SentencePieceModel) -> TokenizerSource:
    def piece(i: int) -> str | None:
        return sp.pieces[i] if 0 <= i < len(sp.pieces) else None

    return TokenizerSource(
        source="sentencepiece",
        model_type=MODEL_TYPES.get(sp.model_type, str(sp.model_type)),
        model_settings={
            "byte_fallback": sp.byte_fallback,
            "scores_sha256": sp.scores_sha256,
            "normalizer_sha256": sp.normalizer_sha256,
        },
        vocab=list(sp.pieces),
        # unknown (2) and control (3) pieces are special; user-defined (4) ones are added but split as text
        added_tokens=[
            AddedTokenFacts(i, p, special=t in (2, 3), normalized=False)
            for i, (p, t) in enumerate(zip(sp.pieces, sp.types, strict=True))
            if t in (2, 3, 4)
        ],
        special_tokens={
            "bos_token": piece(sp.bos_id),
            "eos_token": piece(sp.eos_id),
            "pad_token": piece(sp.pad_id),
            "unk_token": piece(sp.unk_id),
        },
    )


def from_tiktoken(vocab: list[str | None]) -> TokenizerSource:
    # special tokens of tiktoken models live in Python code, not in the file: only ranks compare
    return TokenizerSource(source="tiktoken", model_type="tiktoken", vocab=vocab)


def _tokenizer_json(data: bytes) -> TokenizerSource | None:
    tj = load_tokenizer_json(data)
    if tj is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # only the json fallback parses UTF-16/32; the library needs UTF-8
        raise FileProblem(f"not valid JSON: {exc}") from exc
    return from_tokenizer_json(tj, text)


def load_source(files: RawFiles, problems: dict[str, str]) -> TokenizerSource:
    """The directory's tokenizer (`source` None when it has none); a file that cannot be used is recorded
    in `problems` (file name -> reason)."""
    return _find_source(files, problems) or TokenizerSource(source=None, model_type=None)


def _find_source(files: RawFiles, problems: dict[str, str]) -> TokenizerSource | None:
    data = files.data
    if "tokenizer.json" in data:
        found = attempt(problems, "tokenizer.json", lambda: _tokenizer_json(data["tokenizer.json"]))
        if found is not None:
            return found
    if "tokenizer.model" in data:
        model = data["tokenizer.model"]
        if looks_like_tiktoken(model):
            # Meta's original Llama 3 checkpoints ship their tiktoken ranks under this SentencePiece name
            return attempt(problems, "tokenizer.model", lambda: from_tiktoken(load_tiktoken(model)))
        return attempt(problems, "tokenizer.model", lambda: from_sentencepiece(load_sentencepiece(model)))
    tiktoken_files = [n for n in files.names if n.endswith(".tiktoken") and n in data]
    if tiktoken_files:
        name = tiktoken_files[0]
        return attempt(problems, name, lambda: from_tiktoken(load_tiktoken(data[name])))
    return None
