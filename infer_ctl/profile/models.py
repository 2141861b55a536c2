"""Target and draft models, with SGLang 0.5.23's speculative-decoding rules checked up front.

SGLang silently rewrites some inconsistent settings (topk 1 with num_draft_tokens != num_steps + 1) and
asserts on others (only some of the three numbers set). We refuse both with a message that says why.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from infer_ctl.profile.base import StrictModel


class SpecAlgorithm(StrEnum):
    EAGLE = "EAGLE"
    EAGLE3 = "EAGLE3"
    NEXTN = "NEXTN"
    STANDALONE = "STANDALONE"
    NGRAM = "NGRAM"


# Algorithms whose draft weights live in the target checkpoint (DeepSeek MTP) or need none at all.
_PATH_OPTIONAL = {SpecAlgorithm.NEXTN, SpecAlgorithm.NGRAM}


class TargetModel(StrictModel):
    path: Annotated[str, Field(min_length=1)]
    served_name: str | None = None
    tp: Annotated[int, Field(ge=1, le=64)] = 1
    dp: Annotated[int, Field(ge=1, le=64)] = 1
    context_length: Annotated[int, Field(ge=1)] | None = None
    #: a sizing preset (see `inferctl plan kv --list-presets`) used by plan/sim defaults
    preset: str | None = None
    #: a tokenizer directory if it differs from `path`
    tokenizer_path: str | None = None


class DraftModel(StrictModel):
    algorithm: SpecAlgorithm
    path: str | None = None
    num_steps: Annotated[int, Field(ge=1, le=32)] | None = None
    eagle_topk: Annotated[int, Field(ge=1, le=32)] | None = None
    num_draft_tokens: Annotated[int, Field(ge=1, le=256)] | None = None
    #: FR-Spec token map (EAGLE-2 only; EAGLE3 ignores it)
    token_map: str | None = None
    #: a sizing preset of the draft (`inferctl plan kv --list-presets`): with the target's, its parameter
    #: ratio estimates the draft's cost ratio where `speculative.cost_ratio` is unset (launch.draft_size)
    preset: str | None = None

    @model_validator(mode="after")
    def _sglang_rules(self) -> Self:
        if self.path is None and self.algorithm not in _PATH_OPTIONAL:
            raise ValueError(f"path is required for speculative algorithm {self.algorithm.value}")
        numbers = {
            "num_steps": self.num_steps,
            "eagle_topk": self.eagle_topk,
            "num_draft_tokens": self.num_draft_tokens,
        }
        given = [k for k, v in numbers.items() if v is not None]
        if self.algorithm is not SpecAlgorithm.NGRAM and given and len(given) != 3:
            missing = ", ".join(k for k in numbers if k not in given)
            raise ValueError(
                f"set all three of num_steps, eagle_topk, num_draft_tokens or none of them "
                f"(missing: {missing}); SGLang asserts on a partial set"
            )
        if (
            self.eagle_topk == 1
            and self.num_steps is not None
            and self.num_draft_tokens is not None
            and self.num_draft_tokens != self.num_steps + 1
        ):
            raise ValueError(
                f"with eagle_topk 1, num_draft_tokens must be num_steps + 1 = {self.num_steps + 1} "
                f"(got {self.num_draft_tokens}); SGLang would silently rewrite it to {self.num_steps + 1}"
            )
        if (
            self.eagle_topk is not None
            and self.num_steps is not None
            and self.num_draft_tokens is not None
            and self.eagle_topk > 1
            and self.num_draft_tokens > self.eagle_topk * self.num_steps + 1
        ):
            raise ValueError(
                f"num_draft_tokens {self.num_draft_tokens} exceeds the tree size "
                f"eagle_topk * num_steps + 1 = {self.eagle_topk * self.num_steps + 1}"
            )
        return self


class Models(StrictModel):
    target: TargetModel
    draft: DraftModel | None = None
