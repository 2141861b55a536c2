"""SentencePiece `tokenizer.model`: the ModelProto read from its protocol-buffer wire format directly, so
neither the sentencepiece nor the protobuf library is needed.

Field numbers: https://github.com/google/sentencepiece (src/sentencepiece_model.proto): ModelProto 1 pieces
(1 piece, 2 score, 3 type), 2 trainer_spec (3 model_type, 35 byte_fallback, 40-43 unk/bos/eos/pad ids),
3 normalizer_spec.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from infer_ctl.facts.tokenizer.files import FileProblem, sha256_bytes

#: trainer_spec.model_type -> the name tokenizer.json uses for the same model
MODEL_TYPES = {1: "Unigram", 2: "BPE", 3: "Word", 4: "Char"}


@dataclass(frozen=True)
class SentencePieceModel:
    pieces: list[str]
    #: piece types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
    types: list[int]
    scores_sha256: str
    model_type: int
    byte_fallback: bool
    unk_id: int
    bos_id: int
    eos_id: int
    pad_id: int
    normalizer_sha256: str


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value): an int for varints, the raw bytes for every other wire type."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, wire, value


def _int32(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _piece(buf: bytes) -> tuple[str, float, int]:
    piece, score, kind = "", 0.0, 1
    for n, w, v in _fields(buf):
        if n == 1 and w == 2 and isinstance(v, bytes):
            piece = v.decode("utf-8")
        elif n == 2 and w == 5 and isinstance(v, bytes):
            score = float(struct.unpack("<f", v)[0])
        elif n == 3 and w == 0 and isinstance(v, int):
            kind = v
    return piece, score, kind


def parse_sentencepiece(data: bytes) -> SentencePieceModel:
    pieces: list[str] = []
    types: list[int] = []
    scores: list[float] = []
    trainer: dict[int, int] = {}
    normalizer = b""
    for number, wire, value in _fields(data):
        if not isinstance(value, bytes) or wire != 2:  # the three fields read here are messages
            continue
        if number == 1:
            piece, score, kind = _piece(value)
            pieces.append(piece)
            scores.append(score)
            types.append(kind)
        elif number == 2:
            trainer = {n: v for n, _, v in _fields(value) if isinstance(v, int)}
        elif number == 3:
            normalizer = value
    return SentencePieceModel(
        pieces=pieces,
        types=types,
        scores_sha256=sha256_bytes("\n".join(repr(s) for s in scores).encode()),
        model_type=trainer.get(3, 1),
        byte_fallback=bool(trainer.get(35, 0)),
        unk_id=_int32(trainer.get(40, 0)),
        bos_id=_int32(trainer.get(41, 1)),
        eos_id=_int32(trainer.get(42, 2)),
        pad_id=_int32(trainer.get(43, -1)),
        normalizer_sha256=sha256_bytes(normalizer),
    )


def load_sentencepiece(data: bytes) -> SentencePieceModel:
    try:
        return parse_sentencepiece(data)
    # a truncated varint is an IndexError, a truncated float a struct.error, bad UTF-8 a ValueError
    except (ValueError, IndexError, struct.error) as exc:
        raise FileProblem(f"not a SentencePiece model: {exc}") from exc
