"""The `tokenizers` library behind core's `Encoder` protocol, for the probes. The only module that imports
the library (lazily: it is the optional `tokenizers` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from infer_ctl.errors import InferctlError, MissingExtraError
from infer_ctl.facts.tokenizer.directory import LoadedSide

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class TokenizersEncoder:
    """`core.tokenizer.Encoder` over the tokenizers library, with embedded padding/truncation turned off
    (a tokenizer.json with `padding: Fixed 128` would otherwise pad every probe and hide differences)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return list(self._tok.decode_batch([list(x) for x in ids], skip_special_tokens=False))


def require_tokenizers() -> None:
    """Fail early, with the install command, when the optional `tokenizers` extra is missing."""
    try:
        import tokenizers  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError("tokenizers", "tokenizers", "inferctl check tokenizer") from exc


class TokenizerLoadError(InferctlError):
    """tokenizer.json is valid JSON but the tokenizers library refuses it (so would the server)."""

    def __init__(self, message: str, *, reason: str, remedy: str) -> None:
        super().__init__(message, remedy=remedy)
        self.reason = reason


def build_encoder(side: LoadedSide) -> TokenizersEncoder | None:
    """An encoder for probes, or None where the directory has no tokenizer.json."""
    if side.tokenizer_json is None:
        return None
    require_tokenizers()
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_str(side.tokenizer_json)
    except Exception as exc:  # the library raises plain Exception for every load problem
        raise TokenizerLoadError(
            f"{side.facts.path}/tokenizer.json: the tokenizers library cannot load it: {exc}",
            reason=f"the tokenizers library cannot load it: {exc}",
            remedy="restore tokenizer.json from the model's original release (SGLang would fail to load it too)",
        ) from exc
    return TokenizersEncoder(tokenizer)
