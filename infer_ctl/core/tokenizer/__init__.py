"""Tokenizer parity between a speculative draft and its target: pure comparison, facts in, findings out.

The facts (`TokenizerFacts`) are plain data read from a model directory by
`infer_ctl.facts.tokenizer`; encoding probes goes through the small `Encoder` protocol so this
package never imports the tokenizers library and is tested with any encoder.
"""

from infer_ctl.core.tokenizer.compare import compare_tokenizers
from infer_ctl.core.tokenizer.model import (
    AddedTokenFacts,
    Encoder,
    ModelConfigFacts,
    TokenizerFacts,
    VocabMapFacts,
)

__all__ = [
    "AddedTokenFacts",
    "Encoder",
    "ModelConfigFacts",
    "TokenizerFacts",
    "VocabMapFacts",
    "compare_tokenizers",
]
