"""generation_config.json: the eos id list generation stops on (Llama-3-style chat models stop on more
than the tokenizer's eos_token).

Keys: https://github.com/huggingface/transformers (src/transformers/generation/configuration_utils.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from infer_ctl.facts.tokenizer.files import FileProblem
from infer_ctl.facts.tokenizer.jsonfile import parse_json_object, token_ids


@dataclass(frozen=True)
class GenerationConfig:
    eos_token_id: tuple[int, ...]


def load_generation_config(data: bytes) -> GenerationConfig | None:
    """The file's stop ids; None for an empty object (as if there were no file)."""
    doc = parse_json_object(data)
    try:
        eos = token_ids(doc.get("eos_token_id"))
    except ValueError as exc:
        raise FileProblem(f"unexpected value: {exc}") from exc
    return GenerationConfig(eos) if doc else None
