"""tiktoken rank files (`*.tiktoken`, and the `tokenizer.model` of Meta's original Llama 3 checkpoints):
"<base64 token> <rank>" per line, read as a byte-level vocabulary by id.

Format: https://github.com/openai/tiktoken (tiktoken/load.py, `load_tiktoken_bpe`).
"""

from __future__ import annotations

import base64

from infer_ctl.facts.tokenizer.files import FileProblem
from infer_ctl.facts.tokenizer.tokenizer_json import check_ids


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte -> printable character table, which ByteLevel BPE vocabularies are written in; using
    # it for tiktoken ranks makes a .tiktoken file comparable with a converted tokenizer.json.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


_BYTE_CHARS = _bytes_to_unicode()


def parse_tiktoken(text: str) -> list[str | None]:
    """A .tiktoken file ("<base64 token> <rank>" per line) as a byte-level vocabulary by id."""
    pairs: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        token_b64, rank_text = line.split()
        token = base64.b64decode(token_b64)
        pairs.append((int(rank_text), "".join(_BYTE_CHARS[b] for b in token)))
    # the bound of tokenizer.json ids: a rank of 10**9 would otherwise allocate an 8 GB list
    check_ids([rank for rank, _ in pairs])
    vocab: list[str | None] = [None] * (max((r for r, _ in pairs), default=-1) + 1)
    for rank, token_text in pairs:
        vocab[rank] = token_text
    return vocab


def looks_like_tiktoken(data: bytes) -> bool:
    """A rank file starts with a "<base64> <rank>" text line; a SentencePiece protobuf never does."""
    first = data[:256].split(b"\n", 1)[0].split(b" ")
    return len(first) == 2 and first[1].strip().isdigit() and all(
        c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=" for c in first[0])


def load_tiktoken(data: bytes) -> list[str | None]:
    try:
        return parse_tiktoken(data.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and binascii.Error are ValueErrors too
        raise FileProblem(f"not a tiktoken rank file: {exc}") from exc
