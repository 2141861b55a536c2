"""config.json: the vocabulary size the embedding/lm_head were built for, the bos/eos ids the model was
trained with, and (EAGLE3 heads) the draft vocabulary size; joined with the rows the safetensors headers
actually hold.

Multimodal configs nest the language model's keys under `text_config` (transformers'
`PretrainedConfig.get_text_config`); a top-level key wins.
"""

from __future__ import annotations

from infer_ctl.core.tokenizer.model import ModelConfigFacts
from infer_ctl.facts.tokenizer.files import SHAPE_ERRORS, FileProblem, why
from infer_ctl.facts.tokenizer.jsonfile import JsonObject, positive_count, token_ids
from infer_ctl.facts.tokenizer.weights import WeightFacts


def parse_model_config(doc: JsonObject, weights: WeightFacts | None) -> ModelConfigFacts:
    nested = doc.get("text_config")
    text: JsonObject = nested if isinstance(nested, dict) else {}

    def get(key: str) -> object:
        return doc.get(key, text.get(key))

    weights = weights or WeightFacts()
    return ModelConfigFacts(
        vocab_size=positive_count(get("vocab_size"), "vocab_size"),
        draft_vocab_size=positive_count(get("draft_vocab_size"), "draft_vocab_size"),
        bos_token_id=token_ids(get("bos_token_id")),
        eos_token_id=token_ids(get("eos_token_id")),
        lm_head_rows=weights.lm_head_rows,
        embed_rows=weights.embed_rows,
        lm_head_tensor=weights.lm_head_tensor,
        embed_tensor=weights.embed_tensor,
        weights_format=weights.weights_format,
    )


def model_config(doc: JsonObject, weights: WeightFacts) -> ModelConfigFacts:
    try:
        return parse_model_config(doc, weights)
    except SHAPE_ERRORS as exc:
        raise FileProblem(f"unexpected value: {why(exc)}") from exc
