"""Which files define a model directory's tokenizer, reading each of them once, and the one error the
per-file loaders raise for a file that exists but cannot be used."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

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

# What a well-formed JSON file with the wrong shape raises while being read as a tokenizer/config/header.
SHAPE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError)


class FileProblem(Exception):
    """A file exists but cannot be used; the message is the reason `tokenizer.files` reports."""


def why(exc: Exception) -> str:
    return f"missing key {exc}" if isinstance(exc, KeyError) else f"{exc}"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tokenizer_file_names(directory: Path) -> list[str]:
    return list(TOKENIZER_FILES) + sorted(p.name for p in directory.glob("*.tiktoken"))


@dataclass(frozen=True)
class RawFiles:
    """The bytes of every tokenizer file present, read once; files that exist but could not be read are in
    `unreadable` (name -> reason) and not in `data`."""

    names: tuple[str, ...]
    data: Mapping[str, bytes]
    unreadable: Mapping[str, str]


def read_tokenizer_files(directory: Path) -> RawFiles:
    names = tokenizer_file_names(directory)
    data: dict[str, bytes] = {}
    unreadable: dict[str, str] = {}
    for name in names:
        file = directory / name
        if file.is_file():
            try:
                data[name] = file.read_bytes()
            except OSError as exc:
                unreadable[name] = str(exc)
    return RawFiles(tuple(names), data, unreadable)


T = TypeVar("T")


def attempt(problems: dict[str, str], name: str, load: Callable[[], T]) -> T | None:
    """`load()`, or None with its reason recorded under `name` when the file cannot be used."""
    try:
        return load()
    except FileProblem as exc:
        problems[name] = str(exc)
        return None
