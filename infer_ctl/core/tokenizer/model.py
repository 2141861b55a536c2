"""Plain facts about one model directory's tokenizer, as the comparison needs them.

Everything here is already canonical: the loader (facts/tokenizer/) turns the several on-disk
spellings (old "a b" merges vs new ["a","b"] pairs, eos as int or list, template in tokenizer_config.json
or chat_template.jinja) into one form, so the rules compare values, not formats.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol


@dataclass(frozen=True)
class AddedTokenFacts:
    """One entry of tokenizer.json `added_tokens`, with every flag that changes how text is split."""

    id: int
    content: str
    special: bool = False
    normalized: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False

    #: the flags compared between sides; `special` only changes decode(skip_special_tokens=True)
    FLAGS = ("special", "normalized", "lstrip", "rstrip", "single_word")

    def flags(self) -> dict[str, bool]:
        return {name: bool(getattr(self, name)) for name in self.FLAGS}


@dataclass(frozen=True)
class ModelConfigFacts:
    """config.json numbers that size the embedding/lm_head, plus the safetensors shapes that are the truth."""

    vocab_size: int | None = None
    #: EAGLE3 heads: rows of the draft lm_head (a subset of the target vocabulary, mapped by d2t)
    draft_vocab_size: int | None = None
    bos_token_id: tuple[int, ...] = ()
    eos_token_id: tuple[int, ...] = ()
    #: rows of lm_head.weight / embed_tokens.weight read from safetensors headers (None: no such tensor)
    lm_head_rows: int | None = None
    embed_rows: int | None = None
    #: the tensor names the rows were read from, for messages
    lm_head_tensor: str | None = None
    embed_tensor: str | None = None
    #: "safetensors", "pytorch" (only *.bin/*.pt: not read, inferctl never unpickles) or None (no weights)
    weights_format: str | None = None


@dataclass(frozen=True)
class VocabMapFacts:
    """EAGLE3 draft<->target vocabulary maps (`d2t`, `t2d`) read from the draft checkpoint."""

    d2t: tuple[int, ...] | None = None
    t2d: tuple[bool, ...] | None = None
    d2t_dtype: str | None = None
    t2d_dtype: str | None = None
    #: shapes from the safetensors header: both must be 1-D (SGLang adds arange(shape[0]) to d2t)
    d2t_shape: tuple[int, ...] | None = None
    t2d_shape: tuple[int, ...] | None = None
    source: str | None = None
    #: a tensor that exists but could not be decoded (dtype, truncated file, ...)
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class TokenizerFacts:
    """One side (target or draft) of the comparison."""

    label: str
    path: str
    #: file name -> sha256 of every tokenizer file found (fleet mode compares these)
    files: Mapping[str, str] = field(default_factory=dict)
    #: where the vocabulary came from: "tokenizer.json", "tiktoken", "sentencepiece" or None (no tokenizer)
    source: str | None = None
    model_type: str | None = None
    #: BPE/Unigram/WordPiece settings that change encoding (byte_fallback, dropout, unk_token, ...)
    model_settings: Mapping[str, Any] = field(default_factory=dict)
    #: token by id; None marks a hole (an id no token uses)
    vocab: Sequence[str | None] = ()
    #: canonical merges ("a b"), compared by hash first and walked only when the hashes differ
    merges: Sequence[str] = ()
    merges_sha256: str | None = None
    added_tokens: Sequence[AddedTokenFacts] = ()
    #: canonical JSON of normalizer / pre_tokenizer / post_processor / decoder (None when absent)
    pipeline: Mapping[str, str | None] = field(default_factory=dict)
    #: embedded padding/truncation settings of tokenizer.json (raw encodes would pad/truncate)
    padding: str | None = None
    truncation: str | None = None
    #: tokenizer_config.json (+ special_tokens_map.json for what it lacks): names of the special tokens
    special_tokens: Mapping[str, str | None] = field(default_factory=dict)
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    tokenizer_class: str | None = None
    #: tokenizer_config.json flags that change decoding or slow-tokenizer conversion (legacy, clean_up_...)
    config_flags: Mapping[str, Any] = field(default_factory=dict)
    chat_template: str | None = None
    chat_template_source: str | None = None
    #: generation_config.json
    generation_eos: tuple[int, ...] | None = None
    config: ModelConfigFacts | None = None
    vocab_map: VocabMapFacts | None = None
    #: files that exist but could not be read or parsed: file name -> reason
    problems: Mapping[str, str] = field(default_factory=dict)

    @property
    def has_tokenizer(self) -> bool:
        return self.source is not None

    @cached_property
    def length(self) -> int:
        """len(tokenizer): the number of ids that have a token."""
        return len(self.vocab) - self._vocab_list.count(None)

    @cached_property
    def max_id(self) -> int | None:
        for i in range(len(self.vocab) - 1, -1, -1):
            if self.vocab[i] is not None:
                return i
        return None

    def token_id(self, content: str | None) -> int | None:
        """The id of a token by its text (added tokens first, as the tokenizer resolves them)."""
        if content is None:
            return None
        for tok in self.added_tokens:
            if tok.content == content:
                return tok.id
        return self.find(content)

    def find(self, token: str) -> int | None:
        """The first id of `token` in the vocabulary: a C-speed scan, cheaper than building an index for
        the few lookups a comparison makes."""
        try:
            return self._vocab_list.index(token)
        except ValueError:
            return None

    @cached_property
    def _vocab_list(self) -> list[str | None]:
        return self.vocab if isinstance(self.vocab, list) else list(self.vocab)


class Encoder(Protocol):
    """What the probe comparison needs from a loaded tokenizer (facts/ wraps the tokenizers library)."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of each text, without special tokens added by a post-processor."""
        ...

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Text of each id list, special tokens kept."""
        ...
