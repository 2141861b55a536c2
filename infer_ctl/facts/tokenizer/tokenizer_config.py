"""transformers' tokenizer files beside tokenizer.json: tokenizer_config.json, special_tokens_map.json and
chat_template.jinja (special-token names, add_bos/add_eos, the flags that change what transformers does
with the same tokenizer.json, and the chat template).

Keys as transformers reads them: https://github.com/huggingface/transformers
(src/transformers/tokenization_utils_base.py, `PreTrainedTokenizerBase.from_pretrained`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from infer_ctl.facts.tokenizer.files import FileProblem
from infer_ctl.facts.tokenizer.jsonfile import JsonObject, canonical_json, parse_json_object

SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")
#: tokenizer_config.json keys that change what transformers does with the same tokenizer.json
CONFIG_FLAGS = ("legacy", "clean_up_tokenization_spaces", "add_prefix_space", "do_lower_case")


@dataclass(frozen=True)
class TokenizerConfig:
    #: the special-token names the file sets (a name set to null is None; a name left out is absent)
    special_tokens: Mapping[str, str | None] = field(default_factory=dict)
    add_bos_token: bool | None = None
    add_eos_token: bool | None = None
    tokenizer_class: str | None = None
    flags: Mapping[str, object] = field(default_factory=dict)
    chat_template: str | None = None


def token_text(name: str, value: object) -> str | None:
    """A special token as written: its text, or an AddedToken object's `content` (which must be text)."""
    if isinstance(value, dict):
        content = value.get("content")
        if content is not None and not isinstance(content, str):
            raise FileProblem(f"unexpected value: {name} content {content!r} is not a string")
        return content
    return value if isinstance(value, str) else None


def special_tokens(doc: JsonObject) -> dict[str, str | None]:
    return {name: token_text(name, doc[name]) for name in SPECIAL_NAMES if name in doc}


def pick_chat_template(value: object) -> str | None:
    """tokenizer_config `chat_template` is a string or a list of {name, template}: take "default"."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


def parse_tokenizer_config(doc: JsonObject) -> TokenizerConfig:
    cls = doc.get("tokenizer_class")
    return TokenizerConfig(
        special_tokens=special_tokens(doc),
        add_bos_token=bool(doc["add_bos_token"]) if "add_bos_token" in doc else None,
        add_eos_token=bool(doc["add_eos_token"]) if "add_eos_token" in doc else None,
        # a class name is a string; anything else is shown as its JSON rather than dropped
        tokenizer_class=cls if cls is None or isinstance(cls, str) else canonical_json(cls),
        flags={k: doc[k] for k in CONFIG_FLAGS if k in doc},
        chat_template=pick_chat_template(doc.get("chat_template")),
    )


def load_tokenizer_config(data: bytes) -> TokenizerConfig:
    return parse_tokenizer_config(parse_json_object(data))


def load_special_tokens_map(data: bytes) -> dict[str, str | None]:
    return special_tokens(parse_json_object(data))


def load_chat_template(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"not UTF-8 text: {exc}") from exc
