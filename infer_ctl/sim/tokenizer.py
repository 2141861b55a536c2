"""Tokenizers of the simulator: a deterministic built-in one, or a real `tokenizer.json` file.

The built-in tokenizer splits text into words, whitespace runs and punctuation and maps each piece to a
stable id (CRC32, not Python's salted hash), so the same text gives the same ids in every process and
a shared text prefix gives a shared token prefix, which is what prefix caching needs. Output tokens
are drawn from a small fixed word list whose ids decode back to text.
"""

from __future__ import annotations

import re
import zlib
from typing import Protocol

_PIECE = re.compile(r" ?\w+| ?[^\w\s]|\s+")

#: Output vocabulary: ids 0..len-1 decode to these words (with a leading space).
_WORD_LIST = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there one all we their has been if more when will would "
    "who so no cache token prefill decode router model server request batch latency queue draft "
    "accept verify system prompt tenant policy answer support example data"
)
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())
VOCAB_SIZE = 128_256  # Llama-3's vocabulary size; ids of input pieces land above the word list


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class BuiltinTokenizer:
    name = "builtin"

    def __init__(self) -> None:
        self._memo: dict[str, int] = {}
        self._reverse: dict[int, str] = {}

    def _id(self, piece: str) -> int:
        tid = self._memo.get(piece)
        if tid is None:
            tid = len(WORDS) + zlib.crc32(piece.encode()) % (VOCAB_SIZE - len(WORDS))
            if len(self._memo) < 1_000_000:  # bounded: a long-running server must not grow forever
                self._memo[piece] = tid
                self._reverse.setdefault(tid, piece)
        return tid

    def encode(self, text: str) -> list[int]:
        ids = self._id
        return [ids(p) for p in _PIECE.findall(text)]

    def decode(self, ids: list[int]) -> str:
        out = []
        for tid in ids:
            if 0 <= tid < len(WORDS):
                out.append(" " + WORDS[tid])
            else:
                out.append(self._reverse.get(tid, f"<{tid}>"))
        return "".join(out)


class FileTokenizer:
    """A Hugging Face `tokenizer.json` loaded with the `tokenizers` library (the `tokenizers` extra)."""

    def __init__(self, path: str) -> None:
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from infer_ctl.errors import MissingExtraError

            raise MissingExtraError("tokenizers", "tokenizers", "a simulator with a tokenizer file") from exc
        self._tok = HfTokenizer.from_file(path)
        self.name = path

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids))


def make_tokenizer(path: str | None) -> Tokenizer:
    return FileTokenizer(path) if path else BuiltinTokenizer()


def render_chat(messages: list[dict[str, object]]) -> str:
    """Llama-3-style chat template, so a shared system prompt is a shared token prefix."""
    parts = ["<|begin_of_text|>"]
    for msg in messages:
        content = msg.get("content", "")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|start_header_id|>{msg.get('role', 'user')}<|end_header_id|>\n\n{content}<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)
