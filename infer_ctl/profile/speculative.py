"""Speculative decoding in operation (docs/speculative.md): the acceptance alert, the controller's
limits, and the decode pools with the step count each runs.

A *pool* is a set of decode nodes judged and changed together (their decodes run the same draft
settings). Decode nodes no pool lists are each a pool of their own, named after the node. Per-pool keys
left unset take the section's values. The cross-field rules (pool nodes exist and decode, min <= max,
adaptive candidates, `act` needs a router) are in profile.py with the other rules spanning sections.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from infer_ctl.profile.base import StrictModel
from infer_ctl.profile.nodes import NodeName

Steps = Annotated[int, Field(ge=1, le=32)]
#: SGLang's adaptive candidates may include 0 (no drafting in that interval)
CandidateSteps = Annotated[int, Field(ge=0, le=32)]
Threshold = Annotated[float, Field(gt=0, lt=1)]
#: seconds: finite (an infinite sustain or cool-down silently disables the controller)
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
CostRatio = Annotated[float, Field(ge=0, lt=1)]
#: the cost ratio judged with when neither the profile nor a measurement gives one: an EAGLE3 draft
#: head next to a 70B target (the sizing tables' figure, docs/sizing.md)
DEFAULT_COST_RATIO = 0.1


class SpecPool(StrictModel):
    name: NodeName
    nodes: Annotated[list[NodeName], Field(min_length=1)]
    alert_threshold: Threshold | None = None
    cost_ratio: CostRatio | None = None
    min_steps: Steps | None = None
    max_steps: Steps | None = None
    #: the step count this pool's decodes run instead of models.draft.num_steps (num_draft_tokens
    #: follows: steps + 1 at eagle_topk 1, at most topk * steps + 1 otherwise)
    num_steps: Steps | None = None
    #: run SGLang's --speculative-adaptive choosing among these step counts (EAGLE/EAGLE3, topk 1);
    #: the launch step count (num_steps, else the draft's) must be one of them, as SGLang requires
    adaptive_steps: Annotated[list[CandidateSteps], Field(min_length=1)] | None = None


class SpeculativeSettings(StrictModel):
    #: off: measure and alert only; advise: print the profile change and the command that applies it;
    #: act: apply it (rolling relaunch of the pool, one decode at a time, drained from the router first)
    control: Literal["off", "advise", "act"] = "off"
    #: alpha below which a pool WARNs (the production checklist's 50 %)
    alert_threshold: Threshold = 0.5
    #: draft step cost / target step cost (c of the speedup formula); unset: 0.1
    cost_ratio: CostRatio | None = None
    #: the step counts the controller may choose from
    min_steps: Steps = 1
    max_steps: Steps = 8
    #: the router's rolling window per decode and label, in finished requests
    window_requests: Annotated[int, Field(ge=10, le=100_000)] = 200
    #: a pool is judged only with at least this many requests in its window (fewer: SKIP)
    min_requests: Annotated[int, Field(ge=1)] = 50
    #: alpha must stay below the threshold this long before `act` changes a pool (and above threshold +
    #: hysteresis this long before a changed pool is restored): hysteresis in time
    sustain_s: Seconds = 120.0
    #: hysteresis in alpha: a changed pool is restored only above alert_threshold + hysteresis
    hysteresis: Annotated[float, Field(ge=0, lt=1)] = 0.05
    #: at most one pool change per cool-down, across all pools
    cooldown_s: Seconds = 900.0
    #: a change must promise at least this throughput ratio (1.02: 2 % better) to be worth a relaunch
    min_gain: Annotated[float, Field(ge=1.0)] = 1.02
    #: where SGLang's adaptive mode applies (EAGLE/EAGLE3, topk 1), change a pool to
    #: --speculative-adaptive with the formula's candidates instead of one fixed step count
    adaptive: bool = False
    pools: list[SpecPool] = Field(default_factory=list)

    @model_validator(mode="after")
    def _reachable(self) -> SpeculativeSettings:
        """Settings under which the controller could never act, refused rather than silently idle."""
        if self.min_requests > self.window_requests:
            raise ValueError(f"min_requests {self.min_requests} is above window_requests {self.window_requests}: "
                             "the window never holds enough requests to judge a pool")
        for where, threshold in (("alert_threshold", self.alert_threshold),
                                 *((f"pools[{i}].alert_threshold", p.alert_threshold)
                                   for i, p in enumerate(self.pools) if p.alert_threshold is not None)):
            if threshold + self.hysteresis >= 1:
                raise ValueError(f"{where} {threshold} + hysteresis {self.hysteresis} is not below 1: a changed "
                                 "pool could never be restored")
        return self
