"""safetensors files read with the standard library: an 8-byte little-endian header length, a JSON header
(tensor name -> dtype, shape, data_offsets), then raw little-endian data. Neither torch nor numpy is needed,
and only the bytes of the tensors asked for are read.

Format: https://github.com/huggingface/safetensors (README, "Format").
"""

from __future__ import annotations

import json
import math
import struct
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infer_ctl.facts.tokenizer.jsonfile import JsonObject

#: safetensors dtype -> array typecode, for the integer/bool tensors read here (d2t, t2d)
_DTYPES = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "BOOL": "b"}
# A real header is at most a few MB; a larger length means the file is not safetensors at all.
_MAX_HEADER = 100_000_000


@dataclass(frozen=True)
class SafetensorsHeader:
    #: file offset of the first data byte (8 + the header length); data_offsets count from here
    data_start: int
    #: tensor name -> its header entry as written ({"dtype", "shape", "data_offsets"}); an entry is checked
    #: when its tensor is read, so a malformed entry of a tensor nothing reads is no problem
    tensors: Mapping[str, JsonObject]


@dataclass(frozen=True)
class IntTensor:
    dtype: str
    shape: tuple[int, ...]
    #: the values in row-major order
    values: list[int]


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("file shorter than the 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER:
            raise ValueError(f"header length {length} is implausible; not a safetensors file")
        blob = fh.read(length)
    if len(blob) != length:
        raise ValueError(f"header is truncated ({len(blob)} of {length} bytes)")
    header = json.loads(blob.decode("utf-8"))
    if not isinstance(header, dict) or not all(isinstance(v, dict) for k, v in header.items() if k != "__metadata__"):
        raise ValueError("header is not a JSON object of tensor entries")
    header.pop("__metadata__", None)
    return SafetensorsHeader(data_start=8 + int(length), tensors=header)


def read_int_tensor(path: Path, header: SafetensorsHeader, name: str) -> IntTensor:
    """One integer/bool tensor, reading only its bytes. A malformed entry raises ValueError (or the
    KeyError/TypeError of the missing or wrong-typed key)."""
    entry = header.tensors[name]
    dtype = entry["dtype"]
    code = _DTYPES.get(dtype)
    if code is None:
        raise ValueError(f"tensor {name} has dtype {dtype}; expected an integer or bool tensor")
    begin, end = entry["data_offsets"]
    count = math.prod(entry["shape"])
    values: array[int] = array(code)
    if (end - begin) != count * values.itemsize:
        raise ValueError(f"tensor {name}: {end - begin} bytes for shape {entry['shape']} of {dtype}")
    if header.data_start + end > path.stat().st_size:
        raise ValueError(f"tensor {name} is truncated (the file ends before its data)")
    with path.open("rb") as fh:
        fh.seek(header.data_start + begin)
        raw = fh.read(end - begin)
    if len(raw) != end - begin:
        raise ValueError(f"tensor {name} is truncated ({len(raw)} of {end - begin} bytes)")
    values.frombytes(raw)
    if sys.byteorder != "little":
        values.byteswap()
    shape = tuple(int(n) for n in entry["shape"])
    return IntTensor(str(dtype), shape, values.tolist())
