"""Tokenizers of the simulator: a deterministic built-in one, or a real `tokenizer.json` file.

The built-in tokenizer splits text into words, whitespace runs and punctuation and maps each piece to a
stable id (CRC32, not Python's salted hash), so the same text gives the same ids in every process and
a shared text prefix gives a shared token prefix, which is what prefix caching needs. Output tokens
are drawn from a small fixed word list whose ids decode back to text.
"""

from __future__ import annotations

import os
from typing import Protocol

# the built-in tokenizer and the chat template live in core so a router tokenizes as a simulated worker does
from infer_ctl.core.kvevents.sim_tokenizer import VOCAB_SIZE, WORDS, BuiltinTokenizer, render_chat

__all__ = ["VOCAB_SIZE", "WORDS", "BuiltinTokenizer", "FileTokenizer", "Tokenizer", "make_tokenizer", "render_chat"]


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class FileTokenizer:
    """A Hugging Face `tokenizer.json` loaded with the `tokenizers` library (the `tokenizers` extra). `path`
    may be the model directory that holds it, as SGLang's `--tokenizer-path` is: `/server_info` and
    `/model_info` then report the same path as the engine launched with that directory."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from infer_ctl.errors import MissingExtraError

            raise MissingExtraError("tokenizers", "tokenizers", "a simulator with a tokenizer file") from exc
        self._tok = HfTokenizer.from_file(os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path)
        self.name = path

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))


def make_tokenizer(path: str | None) -> Tokenizer:
    return FileTokenizer(path) if path else BuiltinTokenizer()

