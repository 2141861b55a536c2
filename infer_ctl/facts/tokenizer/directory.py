"""One model directory -> `TokenizerFacts`: each file read once, handed to its loader, the results composed.

This is the only module that decides which file wins where two say the same thing (tokenizer_config.json
over special_tokens_map.json over the SentencePiece ids; chat_template.jinja over the config key, as
transformers does). Every file that exists but cannot be used becomes one entry of `facts.problems`, in the
order the files are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infer_ctl.core.tokenizer.model import ModelConfigFacts, TokenizerFacts, VocabMapFacts
from infer_ctl.facts.tokenizer.files import RawFiles, attempt, read_tokenizer_files, sha256_bytes
from infer_ctl.facts.tokenizer.generation_config import load_generation_config
from infer_ctl.facts.tokenizer.jsonfile import parse_json_object
from infer_ctl.facts.tokenizer.model_config import model_config
from infer_ctl.facts.tokenizer.source import load_source
from infer_ctl.facts.tokenizer.tokenizer_config import (
    SPECIAL_NAMES,
    TokenizerConfig,
    load_chat_template,
    load_special_tokens_map,
    load_tokenizer_config,
)
from infer_ctl.facts.tokenizer.weights import WeightFacts, read_weight_facts


@dataclass(frozen=True)
class LoadedSide:
    facts: TokenizerFacts
    #: tokenizer.json text, kept so the encoder is built without reading the file again
    tokenizer_json: str | None


def _special_tokens(own: Mapping[str, str | None], config: TokenizerConfig,
                    special_map: Mapping[str, str | None] | None) -> dict[str, str | None]:
    specials = dict(own)
    for name in SPECIAL_NAMES:
        if name in config.special_tokens:
            specials[name] = config.special_tokens[name]
        elif special_map is not None and name in special_map:
            specials[name] = special_map[name]
    return specials


def _checkpoint(directory: Path, files: RawFiles,
                problems: dict[str, str]) -> tuple[ModelConfigFacts | None, VocabMapFacts | None]:
    """config.json joined with what the safetensors hold, and the EAGLE3 maps."""
    data = files.data
    doc = attempt(problems, "config.json", lambda: parse_json_object(data["config.json"])) \
        if "config.json" in data else None
    weights = read_weight_facts(directory) if directory.is_dir() else WeightFacts()
    for problem in weights.problems:
        if weights.vocab_map is not None and problem in weights.vocab_map.problems:
            continue  # reported once, by the vocabulary-map rule, with its remedy
        file_name, _, reason = problem.partition(": ")
        problems.setdefault(file_name, reason)
    config = None
    if doc or weights.weights_format is not None:
        config = attempt(problems, "config.json", lambda: model_config(doc or {}, weights))
    return config, weights.vocab_map


def load_tokenizer_dir(path: str | Path, label: str) -> LoadedSide:
    directory = Path(path).expanduser()
    files = read_tokenizer_files(directory)
    data = files.data
    problems = dict(files.unreadable)
    source = load_source(files, problems)

    config = TokenizerConfig()
    if "tokenizer_config.json" in data:
        config = attempt(problems, "tokenizer_config.json",
                         lambda: load_tokenizer_config(data["tokenizer_config.json"])) or config
    special_map = None
    if "special_tokens_map.json" in data:
        special_map = attempt(problems, "special_tokens_map.json",
                              lambda: load_special_tokens_map(data["special_tokens_map.json"]))

    chat_template, template_source = config.chat_template, "tokenizer_config.json"
    if "chat_template.jinja" in data:  # transformers prefers the separate file over the config key
        chat_template = attempt(problems, "chat_template.jinja",
                                lambda: load_chat_template(data["chat_template.jinja"]))
        template_source = "chat_template.jinja"

    generation = None
    if "generation_config.json" in data:
        generation = attempt(problems, "generation_config.json",
                             lambda: load_generation_config(data["generation_config.json"]))
    model, vocab_map = _checkpoint(directory, files, problems)

    facts = TokenizerFacts(
        label=label,
        path=str(directory),
        files={name: sha256_bytes(blob) for name, blob in data.items()},
        source=source.source,
        model_type=source.model_type,
        model_settings=source.model_settings,
        vocab=source.vocab,
        merges=source.merges,
        merges_sha256=source.merges_sha256,
        added_tokens=source.added_tokens,
        pipeline=source.pipeline,
        padding=source.padding,
        truncation=source.truncation,
        special_tokens=_special_tokens(source.special_tokens, config, special_map),
        add_bos_token=config.add_bos_token,
        add_eos_token=config.add_eos_token,
        tokenizer_class=config.tokenizer_class,
        config_flags=config.flags,
        chat_template=chat_template,
        chat_template_source=template_source if chat_template is not None else None,
        generation_eos=generation.eos_token_id if generation is not None else None,
        config=model,
        vocab_map=vocab_map,
        problems=problems,
    )
    return LoadedSide(facts=facts, tokenizer_json=source.tokenizer_json)
