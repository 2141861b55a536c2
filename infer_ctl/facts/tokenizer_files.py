"""Read one model directory's tokenizer into plain `TokenizerFacts`, offline.

Nothing here can reach the network: files are read from the directory and parsed directly (tokenizer.json
with the JSON parser, the `tokenizers` library only to build an encoder for probes; never a hub API), so
HF_HUB_OFFLINE holds by construction. safetensors headers and the EAGLE3 `d2t`/`t2d` tensors are read
with the standard library (the format is an 8-byte length, a JSON header, raw little-endian data), so
neither torch nor numpy is needed and only the bytes of the named tensors are read.

Parsers take bytes/dicts and return plain data; `load_tokenizer_dir` is the only function touching files.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shlex
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer_ctl.core.tokenizer.model import (
    AddedTokenFacts,
    ModelConfigFacts,
    TokenizerFacts,
    VocabMapFacts,
)
from infer_ctl.errors import InferctlError, MissingExtraError
from infer_ctl.remote.base import Command

#: the files that define tokenization, hashed in fleet mode (plus any *.tiktoken)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "config.json",
    "tokenizer.model",
)
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
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "BPE": {"dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
    "WordPiece": {"unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100},
    "WordLevel": {"unk_token": None},
    "Unigram": {"unk_id": None, "byte_fallback": False},
}
SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")
#: tokenizer_config.json keys that change what transformers does with the same tokenizer.json
CONFIG_FLAGS = ("legacy", "clean_up_tokenization_spaces", "add_prefix_space", "do_lower_case")
# The largest real vocabularies have ~262k ids; an id far beyond that is a corrupt file, and building an
# id-indexed list for it would allocate gigabytes (an id of 10**9 took minutes and 8 GB before this bound).
MAX_TOKEN_ID = 1 << 22


def _json_loader() -> Callable[[bytes], Any]:
    # orjson parses the 8 MB DeepSeek tokenizer.json ~3x faster; it is optional, json is the fallback.
    try:
        import orjson
    except ImportError:
        return json.loads
    return orjson.loads


_loads = _json_loader()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


_SEQUENCE_KEYS = ("normalizers", "pretokenizers", "processors", "decoders")


def canonical_section(value: Any) -> str | None:
    """A pipeline section as canonical JSON; a Sequence of nothing is no section, a Sequence of one is that
    one (they behave identically, and writers differ in which form they emit)."""
    if isinstance(value, dict) and value.get("type") == "Sequence":
        items = next((value[k] for k in _SEQUENCE_KEYS if k in value), None)
        if isinstance(items, list) and len(items) <= 1:
            return canonical_section(items[0]) if items else None
    return canonical_json(value)


# ---------------------------------------------------------------- tokenizer.json


@dataclass(frozen=True)
class TokenizerJson:
    """The parts of tokenizer.json the comparison needs, canonicalised."""

    model_type: str | None
    model_settings: dict[str, Any]
    vocab: list[str | None]
    merges: list[str]
    merges_sha256: str | None
    added_tokens: list[AddedTokenFacts]
    pipeline: dict[str, str | None]
    padding: str | None
    truncation: str | None


def parse_tokenizer_json(doc: Mapping[str, Any]) -> TokenizerJson:
    model = doc.get("model") or {}
    model_type = model.get("type")
    raw_vocab = model.get("vocab")
    added = [
        AddedTokenFacts(
            id=int(t["id"]),
            content=str(t["content"]),
            special=bool(t.get("special", False)),
            normalized=bool(t.get("normalized", True)),
            lstrip=bool(t.get("lstrip", False)),
            rstrip=bool(t.get("rstrip", False)),
            single_word=bool(t.get("single_word", False)),
        )
        for t in doc.get("added_tokens") or ()
    ]
    # Built straight into an id-indexed list: this runs over ~129k entries, so no per-entry conversions.
    vocab: list[str | None]
    ids = [t.id for t in added]
    if isinstance(raw_vocab, dict):  # BPE, WordPiece, WordLevel: token -> id
        values = list(raw_vocab.values())
        if values == list(range(len(values))):
            # writers store the vocabulary in id order: the ids are sound and no per-entry loop is needed
            _check_ids(ids)
            vocab = list(raw_vocab)
        else:
            _check_ids(ids + values)
            vocab = [None] * (max(values, default=-1) + 1)
            for tok, i in raw_vocab.items():
                vocab[i] = tok
    elif isinstance(raw_vocab, list):  # Unigram: [[token, score], ...] in id order
        _check_ids(ids)
        vocab = [str(entry[0]) for entry in raw_vocab]
    else:
        _check_ids(ids)
        vocab = []
    for t in added:  # an added token overrides a model token with the same id, as in the library
        if t.id >= len(vocab):
            vocab.extend([None] * (t.id + 1 - len(vocab)))
        vocab[t.id] = t.content
    defaults = MODEL_DEFAULTS.get(str(model_type), {})
    # defaults filled in: a key left out equals its default, and messages show "False -> True", not "None"
    settings = {k: model.get(k, defaults.get(k)) for k in MODEL_SETTINGS if k in model or k in defaults}
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


def _check_ids(ids: Sequence[Any]) -> None:
    """Ids must be small non-negative integers; anything else is a corrupt file, reported as such."""
    if not ids:
        return
    if set(map(type, ids)) != {int}:  # C-speed over 129k ids; bool/float/str ids are corrupt
        bad = next(i for i in ids if type(i) is not int)
        raise ValueError(f"token id {bad!r} is not an integer")
    low, high = min(ids), max(ids)
    if low < 0:
        raise ValueError(f"negative token id {low}")
    if high > MAX_TOKEN_ID:
        raise ValueError(f"token id {high} is implausibly large (over {MAX_TOKEN_ID})")


def canonical_merges(raw: Sequence[Any]) -> list[str]:
    """Old files store merges as "a b" strings, tokenizers >= 0.20 writes ["a", "b"] pairs: one form."""
    if raw and not isinstance(raw[0], str):
        return [f"{a} {b}" for a, b in raw]
    return list(raw)


# ---------------------------------------------------------------- tiktoken and SentencePiece


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
    vocab: list[str | None] = [None] * (max((r for r, _ in pairs), default=-1) + 1)
    for rank, text in pairs:
        vocab[rank] = text
    return vocab


def looks_like_tiktoken(data: bytes) -> bool:
    """A rank file starts with a "<base64> <rank>" text line; a SentencePiece protobuf never does."""
    first = data[:256].split(b"\n", 1)[0].split(b" ")
    return len(first) == 2 and first[1].strip().isdigit() and all(
        c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=" for c in first[0])


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


def _fields(buf: bytes) -> Iterable[tuple[int, int, Any]]:
    """Protocol-buffer wire format, enough for sentencepiece_model.proto (no library needed)."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: Any
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


def parse_sentencepiece(data: bytes) -> SentencePieceModel:
    pieces: list[str] = []
    types: list[int] = []
    scores: list[float] = []
    trainer: dict[int, int] = {}
    normalizer = b""
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            piece, score, kind = "", 0.0, 1
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            pieces.append(piece)
            scores.append(score)
            types.append(kind)
        elif number == 2 and wire == 2:
            trainer = {n: v for n, w, v in _fields(value) if w == 0}
        elif number == 3 and wire == 2:
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


# ---------------------------------------------------------------- safetensors (no torch, no numpy)

_DTYPES = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "BOOL": "b"}


def read_safetensors_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("file shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > 100_000_000:
            raise ValueError(f"header length {length} is implausible; not a safetensors file")
        blob = fh.read(length)
    if len(blob) != length:
        raise ValueError(f"header is truncated ({len(blob)} of {length} bytes)")
    header = json.loads(blob.decode("utf-8"))
    if not isinstance(header, dict) or not all(isinstance(v, dict) for k, v in header.items() if k != "__metadata__"):
        raise ValueError("header is not a JSON object of tensor entries")
    header.pop("__metadata__", None)
    header["__data_start__"] = 8 + length
    return header


def read_int_tensor(path: Path, header: Mapping[str, Any], name: str) -> tuple[str, list[int]]:
    """One integer/bool tensor as a flat list, reading only its bytes (the shape is the header's)."""
    entry = header[name]
    dtype = entry["dtype"]
    code = _DTYPES.get(dtype)
    if code is None:
        raise ValueError(f"tensor {name} has dtype {dtype}; expected an integer or bool tensor")
    begin, end = entry["data_offsets"]
    count = math.prod(entry["shape"])
    values = array(code)
    if (end - begin) != count * values.itemsize:
        raise ValueError(f"tensor {name}: {end - begin} bytes for shape {entry['shape']} of {dtype}")
    if header["__data_start__"] + end > path.stat().st_size:
        raise ValueError(f"tensor {name} is truncated (the file ends before its data)")
    with path.open("rb") as fh:
        fh.seek(header["__data_start__"] + begin)
        raw = fh.read(end - begin)
    if len(raw) != end - begin:
        raise ValueError(f"tensor {name} is truncated ({len(raw)} of {end - begin} bytes)")
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    return dtype, values.tolist()


INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(directory: Path) -> list[Path]:
    """The shards the index names, or every *.safetensors when there is no (readable) index."""
    try:
        weight_map = json.loads((directory / INDEX_FILE).read_bytes())["weight_map"]
        return [directory / str(name) for name in sorted(set(weight_map.values()))]
    except (OSError, *_SHAPE_ERRORS):
        return sorted(directory.glob("*.safetensors"))


def _index_problem(directory: Path) -> str | None:
    index = directory / INDEX_FILE
    if not index.is_file():
        return None
    try:
        doc = json.loads(index.read_bytes())
        if not isinstance(doc.get("weight_map"), dict):
            return f"{INDEX_FILE}: no weight_map object"
    except (OSError, *_SHAPE_ERRORS) as exc:
        return f"{INDEX_FILE}: not valid JSON: {exc}"
    return None


def _rows(entry: Mapping[str, Any], name: str) -> int:
    shape = entry.get("shape")
    if not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(n, int) for n in shape):
        raise ValueError(f"tensor {name} has shape {shape!r}; expected [rows, hidden]")
    return shape[0]


def _find_tensor(names: Iterable[str], suffixes: Sequence[str]) -> str | None:
    names = list(names)
    for suffix in suffixes:
        exact = [n for n in names if n == suffix]
        if exact:
            return exact[0]
        tail = sorted(n for n in names if n.endswith("." + suffix))
        if tail:
            return tail[0]
    return None


_LM_HEAD = ("lm_head.weight", "output.weight")
_EMBED = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")


@dataclass(frozen=True)
class WeightFacts:
    lm_head_rows: int | None = None
    lm_head_tensor: str | None = None
    embed_rows: int | None = None
    embed_tensor: str | None = None
    vocab_map: VocabMapFacts | None = None
    problems: tuple[str, ...] = ()
    weights_format: str | None = None


def read_weight_facts(directory: Path) -> WeightFacts:
    """Rows of lm_head/embeddings and the d2t/t2d maps, from safetensors headers and two small tensors."""
    lm = embed = None
    lm_name = embed_name = None
    d2t = t2d = None
    d2t_dtype = t2d_dtype = map_source = None
    shapes: dict[str, tuple[int, ...]] = {}
    problems: list[str] = []
    if (index_problem := _index_problem(directory)) is not None:
        problems.append(index_problem)
    for path in safetensors_files(directory):
        try:
            header = read_safetensors_header(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        tensors = [n for n in header if not n.startswith("__")]
        try:
            if lm is None and (name := _find_tensor(tensors, _LM_HEAD)):
                lm, lm_name = _rows(header[name], name), name
            if embed is None and (name := _find_tensor(tensors, _EMBED)):
                embed, embed_name = _rows(header[name], name), name
        except ValueError as exc:
            problems.append(f"{path.name}: {exc}")
        for key in ("d2t", "t2d"):
            name = _find_tensor(tensors, (key,))
            if name is None:
                continue
            try:
                dtype, values = read_int_tensor(path, header, name)
                shapes[key] = tuple(int(n) for n in header[name]["shape"])
            except (OSError, *_SHAPE_ERRORS) as exc:
                problems.append(f"{path.name}: " + (str(exc) if isinstance(exc, OSError | ValueError)
                                                    else f"tensor {name}: {_why(exc)}"))
                continue
            map_source = path.name
            if key == "d2t":
                d2t, d2t_dtype = tuple(values), dtype
            else:
                t2d, t2d_dtype = tuple(bool(v) for v in values), dtype
    vocab_map = None
    if d2t is not None or t2d is not None or any("d2t" in p or "t2d" in p for p in problems):
        vocab_map = VocabMapFacts(
            d2t=d2t,
            t2d=t2d,
            d2t_dtype=d2t_dtype,
            t2d_dtype=t2d_dtype,
            d2t_shape=shapes.get("d2t"),
            t2d_shape=shapes.get("t2d"),
            source=map_source,
            problems=tuple(p for p in problems if "d2t" in p or "t2d" in p),
        )
    files = safetensors_files(directory)
    pickled = any(directory.glob("*.bin")) or any(directory.glob("*.pt"))
    weights_format = "safetensors" if files else "pytorch" if pickled else None
    return WeightFacts(lm, lm_name, embed, embed_name, vocab_map, tuple(problems), weights_format)


# ---------------------------------------------------------------- configs


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"token id(s) {value!r} are not integers")
    return tuple(values)


def _count(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{key} {value!r} is not a positive integer")
    return value


def pick_chat_template(value: Any) -> str | None:
    """tokenizer_config `chat_template` is a string or a list of {name, template}: take "default"."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


def parse_model_config(doc: Mapping[str, Any], weights: WeightFacts | None) -> ModelConfigFacts:
    text = doc.get("text_config") if isinstance(doc.get("text_config"), dict) else {}
    def get(key: str) -> Any:
        return doc.get(key, text.get(key) if text else None)
    weights = weights or WeightFacts()
    return ModelConfigFacts(
        model_type=doc.get("model_type"),
        architectures=tuple(doc.get("architectures") or ()),
        vocab_size=_count(get("vocab_size"), "vocab_size"),
        draft_vocab_size=_count(get("draft_vocab_size"), "draft_vocab_size"),
        bos_token_id=_ids(get("bos_token_id")),
        eos_token_id=_ids(get("eos_token_id")),
        lm_head_rows=weights.lm_head_rows,
        embed_rows=weights.embed_rows,
        lm_head_tensor=weights.lm_head_tensor,
        embed_tensor=weights.embed_tensor,
        weights_format=weights.weights_format,
    )


# ---------------------------------------------------------------- one directory

# What a well-formed JSON file with the wrong shape raises while being read as a tokenizer/config/header.
_SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)


def _why(exc: Exception) -> str:
    return f"missing key {exc}" if isinstance(exc, KeyError) else f"{exc}"



@dataclass
class LoadedSide:
    facts: TokenizerFacts
    #: tokenizer.json text, kept so the encoder is built without reading the file again
    tokenizer_json: str | None


def load_tokenizer_dir(path: str | Path, label: str) -> LoadedSide:
    directory = Path(path).expanduser()
    problems: dict[str, str] = {}
    raw: dict[str, bytes] = {}
    names = list(TOKENIZER_FILES) + sorted(p.name for p in directory.glob("*.tiktoken"))
    for name in names:
        file = directory / name
        if file.is_file():
            try:
                raw[name] = file.read_bytes()
            except OSError as exc:
                problems[name] = str(exc)
    hashes = {name: sha256_bytes(data) for name, data in raw.items()}

    def load_json(name: str) -> dict[str, Any]:
        if name not in raw:
            return {}
        try:
            doc = _loads(raw[name])
        except ValueError as exc:
            problems[name] = f"not valid JSON: {exc}"
            return {}
        if not isinstance(doc, dict):
            problems[name] = "not a JSON object"
            return {}
        return doc

    fields: dict[str, Any] = {}
    tokenizer_text: str | None = None
    tj_doc = load_json("tokenizer.json")
    tiktoken_files = [n for n in names if n.endswith(".tiktoken") and n in raw]
    tj: TokenizerJson | None = None
    if tj_doc:
        try:
            tj = parse_tokenizer_json(tj_doc)
        except _SHAPE_ERRORS as exc:
            problems["tokenizer.json"] = f"not a tokenizers file: {_why(exc)}"
    if tj is not None:
        tokenizer_text = raw["tokenizer.json"].decode("utf-8")
        fields.update(
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
        )
    elif "tokenizer.model" in raw and looks_like_tiktoken(raw["tokenizer.model"]):
        # Meta's original Llama 3 checkpoints ship their tiktoken ranks under this SentencePiece name
        try:
            fields.update(source="tiktoken", model_type="tiktoken",
                          vocab=parse_tiktoken(raw["tokenizer.model"].decode("utf-8")))
        except (ValueError, UnicodeDecodeError) as exc:
            problems["tokenizer.model"] = f"not a tiktoken rank file: {exc}"
    elif "tokenizer.model" in raw:
        try:
            sp = parse_sentencepiece(raw["tokenizer.model"])
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            problems["tokenizer.model"] = f"not a SentencePiece model: {exc}"
        else:
            fields.update(
                source="sentencepiece",
                model_type={1: "Unigram", 2: "BPE", 3: "Word", 4: "Char"}.get(sp.model_type, str(sp.model_type)),
                model_settings={
                    "byte_fallback": sp.byte_fallback,
                    "scores_sha256": sp.scores_sha256,
                    "normalizer_sha256": sp.normalizer_sha256,
                },
                vocab=list(sp.pieces),
                added_tokens=[
                    AddedTokenFacts(i, p, special=t in (2, 3), normalized=False)
                    for i, (p, t) in enumerate(zip(sp.pieces, sp.types, strict=True))
                    if t in (2, 3, 4)
                ],
                special_tokens={
                    name: (sp.pieces[i] if 0 <= i < len(sp.pieces) else None)
                    for name, i in (
                        ("bos_token", sp.bos_id),
                        ("eos_token", sp.eos_id),
                        ("pad_token", sp.pad_id),
                        ("unk_token", sp.unk_id),
                    )
                },
            )
    elif tiktoken_files:
        name = tiktoken_files[0]
        try:
            vocab = parse_tiktoken(raw[name].decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            problems[name] = f"not a tiktoken rank file: {exc}"
        else:
            # special tokens of tiktoken models live in Python code, not in the file: only ranks compare
            fields.update(source="tiktoken", model_type="tiktoken", vocab=vocab)

    config = load_json("tokenizer_config.json")
    special_map = load_json("special_tokens_map.json")
    specials = dict(fields.get("special_tokens") or {})
    for name in SPECIAL_NAMES:
        if name in config:
            specials[name] = _token_text(config[name])
        elif name in special_map:
            specials[name] = _token_text(special_map[name])
    fields["special_tokens"] = specials
    if "add_bos_token" in config:
        fields["add_bos_token"] = bool(config["add_bos_token"])
    if "add_eos_token" in config:
        fields["add_eos_token"] = bool(config["add_eos_token"])
    fields["tokenizer_class"] = config.get("tokenizer_class")
    fields["config_flags"] = {k: config[k] for k in CONFIG_FLAGS if k in config}
    if "chat_template.jinja" in raw:
        # transformers prefers the separate file over the tokenizer_config.json key
        fields["chat_template"] = raw["chat_template.jinja"].decode("utf-8")
        fields["chat_template_source"] = "chat_template.jinja"
    elif (template := pick_chat_template(config.get("chat_template"))) is not None:
        fields["chat_template"] = template
        fields["chat_template_source"] = "tokenizer_config.json"

    generation = load_json("generation_config.json")
    try:
        eos_list = _ids(generation.get("eos_token_id"))
    except ValueError as exc:
        problems["generation_config.json"] = f"unexpected value: {exc}"
        generation = {}
    if generation:
        fields["generation_eos"] = eos_list
        fields["generation_bos"] = generation.get("bos_token_id")
        fields["generation_pad"] = generation.get("pad_token_id")

    model_config = load_json("config.json")
    weights = read_weight_facts(directory) if directory.is_dir() else WeightFacts()
    for problem in weights.problems:
        if weights.vocab_map is not None and problem in weights.vocab_map.problems:
            continue  # reported once, by the vocabulary-map rule, with its remedy
        file_name, _, reason = problem.partition(": ")
        problems.setdefault(file_name, reason)
    if model_config or weights.weights_format is not None:
        try:
            fields["config"] = parse_model_config(model_config, weights)
        except _SHAPE_ERRORS as exc:
            problems["config.json"] = f"unexpected value: {_why(exc)}"
    if weights.vocab_map is not None:
        fields["vocab_map"] = weights.vocab_map

    facts = TokenizerFacts(label=label, path=str(directory), files=hashes, problems=problems, **fields)
    return LoadedSide(facts=facts, tokenizer_json=tokenizer_text)


# ---------------------------------------------------------------- the encoder behind core's protocol


class TokenizersEncoder:
    """`core.tokenizer.Encoder` over the tokenizers library, with embedded padding/truncation turned off
    (a tokenizer.json with `padding: Fixed 128` would otherwise pad every probe and hide differences)."""

    def __init__(self, tokenizer: Any) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return list(self._tok.decode_batch([list(x) for x in ids], skip_special_tokens=False))


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as exc:
        raise MissingExtraError("tokenizers", "tokenizers", "inferctl check tokenizer") from exc
    return tokenizers


class TokenizerLoadError(InferctlError):
    """tokenizer.json is valid JSON but the tokenizers library refuses it (so would the server)."""

    def __init__(self, message: str, *, reason: str, remedy: str) -> None:
        super().__init__(message, remedy=remedy)
        self.reason = reason


def build_encoder(side: LoadedSide) -> TokenizersEncoder | None:
    """An encoder for probes, or None where the directory has no tokenizer.json."""
    if side.tokenizer_json is None:
        return None
    tokenizers = require_tokenizers()
    try:
        tokenizer = tokenizers.Tokenizer.from_str(side.tokenizer_json)
    except Exception as exc:  # the library raises plain Exception for every load problem
        raise TokenizerLoadError(
            f"{side.facts.path}/tokenizer.json: the tokenizers library cannot load it: {exc}",
            reason=f"the tokenizers library cannot load it: {exc}",
            remedy="restore tokenizer.json from the model's original release (SGLang would fail to load it too)",
        ) from exc
    return TokenizersEncoder(tokenizer)


# ---------------------------------------------------------------- fleet mode: hashes over SSH

NO_DIR_MARKER = "__inferctl_no_such_directory__"


def tokenizer_hash_command(directory: str) -> Command:
    """sha256 of the tokenizer files in `directory` on a node; only hashes travel back, never the files."""
    names = " ".join(shlex.quote(n) for n in TOKENIZER_FILES)
    # "~/x" means the node's home (quoting would stop the shell expanding it), anything else is literal
    where = f'"$HOME"/{shlex.quote(directory[2:])}' if directory.startswith("~/") else shlex.quote(directory)
    script = (
        f"cd -- {where} 2>/dev/null || {{ echo {NO_DIR_MARKER}; exit 0; }}; "
        f"for f in {names} *.tiktoken; do if [ -f \"$f\" ]; then sha256sum -- \"$f\" || exit 1; fi; done"
    )
    return Command.sh(script)


def parse_sha256sum(text: str) -> dict[str, str] | None:
    """`sha256sum` lines ("<hex>  <name>") -> {name: hex}; None when the directory does not exist."""
    if NO_DIR_MARKER in text:
        return None
    hashes: dict[str, str] = {}
    for line in text.splitlines():
        digest, sep, name = line.partition("  ")
        if not sep:
            digest, sep, name = line.partition(" *")  # binary-mode marker
        if sep and len(digest) == 64:
            hashes[name.strip()] = digest.lower()
    return hashes


def local_hashes(directory: str | Path) -> dict[str, str] | None:
    """The same hashes as `tokenizer_hash_command`, computed on this machine."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        return None
    names = list(TOKENIZER_FILES) + sorted(p.name for p in path.glob("*.tiktoken"))
    return {n: sha256_bytes((path / n).read_bytes()) for n in names if (path / n).is_file()}
