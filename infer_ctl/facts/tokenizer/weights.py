"""What the checkpoint's safetensors say about the vocabulary: lm_head/embedding rows (from headers only)
and the EAGLE3 `d2t`/`t2d` maps (the only tensors whose bytes are read). Pickled `*.bin`/`*.pt` weights
are noticed, never opened.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from infer_ctl.core.tokenizer.model import VocabMapFacts
from infer_ctl.facts.tokenizer.files import SHAPE_ERRORS, why
from infer_ctl.facts.tokenizer.safetensors import IntTensor, read_int_tensor, read_safetensors_header

INDEX_FILE = "model.safetensors.index.json"
_LM_HEAD = ("lm_head.weight", "output.weight")
_EMBED = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "tok_embeddings.weight")


@dataclass(frozen=True)
class WeightFacts:
    lm_head_rows: int | None = None
    lm_head_tensor: str | None = None
    embed_rows: int | None = None
    embed_tensor: str | None = None
    vocab_map: VocabMapFacts | None = None
    #: "<file>: <reason>" for every shard, index or tensor that could not be read
    problems: tuple[str, ...] = ()
    #: "safetensors", "pytorch" (only pickled weights) or None (no weights)
    weights_format: str | None = None


def safetensors_files(directory: Path) -> list[Path]:
    """The shards the index names, or every *.safetensors when there is no (readable) index."""
    try:
        weight_map = json.loads((directory / INDEX_FILE).read_bytes())["weight_map"]
        return [directory / str(name) for name in sorted(set(weight_map.values()))]
    except (OSError, *SHAPE_ERRORS):
        return sorted(directory.glob("*.safetensors"))


def _index_problem(directory: Path) -> str | None:
    index = directory / INDEX_FILE
    if not index.is_file():
        return None
    try:
        doc = json.loads(index.read_bytes())
        if not isinstance(doc.get("weight_map"), dict):
            return f"{INDEX_FILE}: no weight_map object"
    except (OSError, *SHAPE_ERRORS) as exc:
        return f"{INDEX_FILE}: not valid JSON: {exc}"
    return None


def _rows(entry: Mapping[str, object], name: str) -> int:
    shape = entry.get("shape")
    if not isinstance(shape, list) or len(shape) != 2 or not all(isinstance(n, int) for n in shape):
        raise ValueError(f"tensor {name} has shape {shape!r}; expected [rows, hidden]")
    rows: int = shape[0]
    return rows


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


def _is_map_problem(problem: str) -> bool:
    return "d2t" in problem or "t2d" in problem


def read_weight_facts(directory: Path) -> WeightFacts:
    """Rows of lm_head/embeddings and the d2t/t2d maps, from safetensors headers and two small tensors."""
    lm = embed = None
    lm_name = embed_name = None
    maps: dict[str, IntTensor] = {}
    map_source = None
    problems: list[str] = []
    if (index_problem := _index_problem(directory)) is not None:
        problems.append(index_problem)
    for path in safetensors_files(directory):
        try:
            header = read_safetensors_header(path)
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: {exc}")
            continue
        tensors = [n for n in header.tensors if not n.startswith("__")]
        try:
            if lm is None and (name := _find_tensor(tensors, _LM_HEAD)):
                lm, lm_name = _rows(header.tensors[name], name), name
            if embed is None and (name := _find_tensor(tensors, _EMBED)):
                embed, embed_name = _rows(header.tensors[name], name), name
        except ValueError as exc:
            problems.append(f"{path.name}: {exc}")
        for key in ("d2t", "t2d"):
            name = _find_tensor(tensors, (key,))
            if name is None:
                continue
            try:
                maps[key] = read_int_tensor(path, header, name)
            except (OSError, *SHAPE_ERRORS) as exc:
                problems.append(f"{path.name}: " + (str(exc) if isinstance(exc, OSError | ValueError)
                                                    else f"tensor {name}: {why(exc)}"))
                continue
            map_source = path.name
    vocab_map = None
    d2t, t2d = maps.get("d2t"), maps.get("t2d")
    if d2t is not None or t2d is not None or any(_is_map_problem(p) for p in problems):
        vocab_map = VocabMapFacts(
            d2t=None if d2t is None else tuple(d2t.values),
            t2d=None if t2d is None else tuple(bool(v) for v in t2d.values),
            d2t_dtype=None if d2t is None else d2t.dtype,
            t2d_dtype=None if t2d is None else t2d.dtype,
            d2t_shape=None if d2t is None else d2t.shape,
            t2d_shape=None if t2d is None else t2d.shape,
            source=map_source,
            problems=tuple(p for p in problems if _is_map_problem(p)),
        )
    files = safetensors_files(directory)
    pickled = any(directory.glob("*.bin")) or any(directory.glob("*.pt"))
    weights_format = "safetensors" if files else "pytorch" if pickled else None
    return WeightFacts(lm, lm_name, embed, embed_name, vocab_map, tuple(problems), weights_format)
