"""The simulator's built-in tokenizer and chat template. Pure.

Shared so that a router tokenizes a prompt exactly as a simulated worker does (the worker's KV events
carry token ids; matching a prompt against them needs the same ids). The tokenizer splits text into
words, whitespace runs and punctuation and maps each piece to a stable id (CRC32, not Python's salted
hash), so the same text gives the same ids in every process and a shared text prefix gives a shared
token prefix, which is what prefix caching needs. Output tokens are drawn from a small fixed word list
whose ids decode back to text.
"""

from __future__ import annotations

import itertools
import re
import zlib

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
        # the memo first: a hit (nearly every piece of a long prompt) costs one dict lookup, not a call;
        # an id is never 0 (ids of pieces start at len(WORDS)), so `or` only falls through on a miss
        get, ids = self._memo.get, self._id
        return [get(p) or ids(p) for p in _PIECE.findall(text)]

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """The ids of `text` and where each piece ends (exclusive character offsets). The pieces cover
        the text without gaps, and a piece is decided by its own characters plus one character of
        lookahead, so tokenizing resumes exactly at any piece end of a longer text's tokenization."""
        pieces = _PIECE.findall(text)
        get, ids = self._memo.get, self._id
        # no gaps (every character is \w, \s or neither): a piece ends where the lengths so far sum to
        return [get(p) or ids(p) for p in pieces], list(itertools.accumulate(map(len, pieces)))

    def decode(self, ids: list[int]) -> str:
        out = []
        for tid in ids:
            if 0 <= tid < len(WORDS):
                out.append(" " + WORDS[tid])
            else:
                out.append(self._reverse.get(tid, f"<{tid}>"))
        return "".join(out)


def message_text(content: object) -> str:
    """A chat message's text: a string, or the text parts of OpenAI content parts."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else str(content)


def render_chat(messages: list[dict[str, object]]) -> str:
    """Llama-3-style chat template, so a shared system prompt is a shared token prefix."""
    parts = ["<|begin_of_text|>"]
    for msg in messages:
        content = message_text(msg.get("content", ""))
        parts.append(f"<|start_header_id|>{msg.get('role', 'user')}<|end_header_id|>\n\n{content}<|eot_id|>")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)
