"""Candidate step counts for SGLang's `--speculative-adaptive`, from the speedup formula.

SGLang 0.5.23's adaptive controller (`sglang/srt/speculative/adaptive_spec_params.py`) moves a decode's
step count among `candidate_steps` of an `--speculative-adaptive-config` JSON file, following an EMA of
accepted drafts. Its default candidates (1, 3, 5, 7 for small batches) are generic; the formula says
which step counts can be optimal at all for this pool's cost ratio c: the argmax of S(alpha, g, c) over
the allowed steps for every alpha. Those (and 0, no drafting, where even one step loses: alpha < c)
are the candidates, so the engine only ever switches between settings that are best for some alpha.

SGLang applies adaptive mode to EAGLE/EAGLE3 with topk 1 only (`adaptive_unsupported_reason`: another
algorithm or topk, attention DP, multi-layer EAGLE make it warn and run static steps), requires the
launch `--speculative-num-steps` to be a candidate (`speculative_hook._init_adaptive_speculative_params`)
and sets num_draft_tokens = steps + 1. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from infer_ctl.core.spec.judge import recommend_steps

ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")
#: the highest alpha the candidates are derived for: EAGLE-3's best domains (JSON, code) measure ~0.88
#: (docs/sizing.md); above it every formula wants the longest lookahead allowed
ALPHA_HIGH = 0.9


def adaptive_applies(algorithm: str | None, topk: int | None) -> bool:
    """Whether SGLang runs `--speculative-adaptive` for this draft (EAGLE/EAGLE3, topk 1 or unset)."""
    return (algorithm or "").upper() in ADAPTIVE_ALGORITHMS and topk in (None, 1)


def formula_candidates(cost_ratio: float, min_steps: int, max_steps: int, *, allow_zero: bool = True,
                       alpha_high: float = ALPHA_HIGH) -> list[int]:
    """Every step count in [min_steps, max_steps] that maximises S for some alpha up to `alpha_high`
    (on a 0.01 grid: a finer one finds no other argmax), plus 0 when allowed (below alpha = c no step
    count pays, and SGLang's candidate 0 stops drafting)."""
    allowed = range(min_steps, max_steps + 1)
    grid = [i / 100 for i in range(1, int(alpha_high * 100) + 1)]
    found = {recommend_steps(a, cost_ratio, allowed)[0] for a in grid}
    if allow_zero and cost_ratio > 0:
        found.add(0)
    return sorted(found)


def launch_candidate(candidates: Sequence[int], preferred: int) -> int:
    """The launch step count: `preferred` when it is a candidate (SGLang refuses any other), else the
    nearest non-zero candidate (the larger on a tie)."""
    if preferred in candidates:
        return preferred
    usable = [c for c in candidates if c > 0] or list(candidates)
    return min(usable, key=lambda c: (abs(c - preferred), -c))


def adaptive_config(candidates: Sequence[int]) -> dict[str, dict[str, list[int]]]:
    """The `--speculative-adaptive-config` document: one batch-size slot ("1": every batch size, since
    SGLang routes a batch to the largest configured size not above it) with these candidates; the
    EMA knobs keep SGLang's defaults."""
    return {"1": {"candidate_steps": sorted(set(candidates))}}


def adaptive_config_text(candidates: Sequence[int]) -> str:
    return json.dumps(adaptive_config(candidates), sort_keys=True, separators=(",", ":")) + "\n"
