"""SGLang's `--speculative-adaptive`: an EMA of accepted drafts picks `speculative_num_steps` among
candidate step counts, per batch-size slot. Pure; the algorithm and defaults of SGLang 0.5.23
`sglang/srt/speculative/adaptive_spec_params.py` (`AdaptiveStepSlot`, `AdaptiveSpeculativeParams`,
`DEFAULT_ADAPTIVE_CONFIG`, `_load_adaptive_config`), driven as `speculative/eagle_worker_v2.py` and
`adaptive_runtime_state.py` drive it: before a decode forward the batch size picks its slot's current
steps (`activate_step_by_batch`), after the verify the per-request accepted-draft counts feed that slot
(`on_verify_complete`, from `scheduler_components/batch_result_processor.py`).

SGLang accepts it for EAGLE/EAGLE3 with topk 1 only (`adaptive_unsupported_reason`; otherwise it warns
and runs static steps), requires the launch `--speculative-num-steps` to be one of the candidates
(`speculative_hook._init_adaptive_speculative_params`; unset = the middle candidate) and sets
num_draft_tokens = steps + 1. Without CUDA graphs (the simulator has none) a batch routes to the slot
of the largest configured batch size <= its size.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG: batch-size slot -> knobs
DEFAULT_ADAPTIVE_CONFIG: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25, "ceiling_coeff": 0},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0, "ceiling_coeff": 0},
}
#: AdaptiveStepSlot's defaults for knobs a config leaves out
SLOT_DEFAULTS: dict[str, Any] = {
    "ema_alpha": 0.2,
    "update_interval": 5,
    "warmup_batches": 10,
    "down_hysteresis": -0.25,
    "up_hysteresis": 0.0,
    "ceiling_coeff": 0,
}
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")


def load_adaptive_config(source: str | Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(whole config, batch-size slot -> entry) from a JSON file path, a dict, or None (the default).
    Non-digit keys are knobs shared by every slot. Raises ValueError as SGLang does."""
    if source is None:
        cfg: Mapping[str, Any] = DEFAULT_ADAPTIVE_CONFIG
    elif isinstance(source, str):
        try:
            cfg = json.loads(Path(source).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read --speculative-adaptive-config {source}: {exc}") from None
    else:
        cfg = source
    if not isinstance(cfg, Mapping):
        raise ValueError("speculative_adaptive_config must be a JSON object")
    slots: dict[int, dict[str, Any]] = {}
    for key, entry in cfg.items():
        if not str(key).isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        if not isinstance(steps, list) or not steps or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps
        ):
            raise ValueError(f"BS {key}: candidate_steps must be a list of non-negative ints, got {steps!r}")
        slots[int(key)] = dict(entry)
    if not slots:
        raise ValueError(
            "speculative_adaptive_config must contain at least one integer-string BS key, e.g. "
            f'{{"1": {{"candidate_steps": [1,3,7]}}}}. Got keys: {list(cfg)}'
        )
    return dict(cfg), slots


def candidate_steps(source: str | Mapping[str, Any] | None) -> list[int]:
    """Every slot's candidates together (SGLang's `resolve_candidate_steps_from_config`)."""
    _, slots = load_adaptive_config(source)
    return sorted({s for e in slots.values() for s in e["candidate_steps"]})


def launch_steps(num_steps: int | None, source: str | Mapping[str, Any] | None) -> int:
    """The launch step count SGLang resolves: unset = the middle candidate; must be a candidate."""
    cands = candidate_steps(source)
    if num_steps is None:
        return cands[len(cands) // 2]
    if num_steps not in cands:
        raise ValueError(
            f"--speculative-num-steps={num_steps} is not in the adaptive config candidate_steps {cands}. "
            "Pass one of those values."
        )
    return num_steps


class AdaptiveStepSlot:
    """One batch-size slot: EMA of accepted drafts per request-step -> the step count to run."""

    def __init__(self, initial_steps: int, cfg: Mapping[str, Any]) -> None:
        knobs = {**SLOT_DEFAULTS, **cfg}
        self.candidate_steps: list[int] = sorted(set(cfg["candidate_steps"]))
        self.ema_alpha = float(knobs["ema_alpha"])
        self.update_interval = int(knobs["update_interval"])
        self.warmup_batches = int(knobs["warmup_batches"])
        self.down_hysteresis = float(knobs["down_hysteresis"])
        self.up_hysteresis = float(knobs["up_hysteresis"])
        self.ceiling_coeff = float(knobs["ceiling_coeff"])
        if initial_steps in self.candidate_steps:
            self.current_steps = initial_steps
        else:
            self.current_steps = self.candidate_steps[len(self.candidate_steps) // 2]
        # neutral start: one draft fewer than the steps run
        self.ema_accept_len = float(self.current_steps - 1)
        self.batch_count = 0

    def update(self, correct_per_req: list[int]) -> bool:
        """Feed one verify's accepted-draft counts; True when the step count changed."""
        if not correct_per_req:
            return False
        if self.current_steps > 0:  # a 0-step (no draft) interval says nothing about acceptance
            mean = sum(correct_per_req) / len(correct_per_req)
            self.ema_accept_len = (1 - self.ema_alpha) * self.ema_accept_len + self.ema_alpha * mean
        self.batch_count += 1
        if self.batch_count <= self.warmup_batches:
            return False
        if (self.batch_count - self.warmup_batches) % self.update_interval != 0:
            return False
        return self._recompute()

    def _recompute(self) -> bool:
        old = self.current_steps
        cands = self.candidate_steps
        idx = old_idx = cands.index(old)
        if old == 0:  # after a no-draft interval, probe the next candidate up
            idx = min(idx + 1, len(cands) - 1)
            target = cands[idx]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            return self._apply(target)
        while idx > 0:
            prev = cands[idx - 1]
            drop = (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis
            if self.ema_accept_len <= drop:
                idx -= 1
            else:
                break
        if idx >= old_idx:
            while idx < len(cands) - 1 and self.ema_accept_len > cands[idx] - 0.5 + self.up_hysteresis:
                idx += 1
        target = cands[idx]
        if self.ceiling_coeff > 0:  # caps downward moves only
            ceiling = max(1, math.ceil(self.ema_accept_len * self.ceiling_coeff))
            if ceiling < target <= old:
                while idx > 0 and cands[idx] > ceiling:
                    idx -= 1
                target = cands[idx]
        return self._apply(target)

    def _apply(self, target: int) -> bool:
        if target == self.current_steps:
            return False
        self.current_steps = target
        return True


class AdaptiveSpeculativeParams:
    """Routes a batch size to its slot (the largest configured size <= it)."""

    def __init__(self, initial_steps: int, source: str | Mapping[str, Any] | None = None) -> None:
        cfg, slots = load_adaptive_config(source)
        shared = {k: v for k, v in cfg.items() if not str(k).isdigit()}
        self.bs_list = sorted(slots)
        self.slots = {bs: AdaptiveStepSlot(initial_steps, {**shared, **slots[bs]}) for bs in self.bs_list}
        self.switches = 0

    @property
    def candidate_steps(self) -> list[int]:
        return sorted({s for slot in self.slots.values() for s in slot.candidate_steps})

    def slot_for(self, batch_size: int) -> AdaptiveStepSlot:
        i = bisect.bisect_right(self.bs_list, batch_size) - 1
        return self.slots[self.bs_list[max(0, i)]]

    def steps_for_batch(self, batch_size: int) -> int:
        return self.slot_for(batch_size).current_steps

    def on_verify_complete(self, correct_per_req: list[int], batch_size: int) -> int | None:
        """The new step count when this verify made the batch's slot switch, else None."""
        slot = self.slot_for(batch_size)
        if slot.update(correct_per_req):
            self.switches += 1
            return slot.current_steps
        return None

    def snapshot(self) -> dict[str, Any]:
        return {
            str(bs): {
                "candidate_steps": s.candidate_steps,
                "current_steps": s.current_steps,
                "ema_accept_len": s.ema_accept_len,
                "batch_count": s.batch_count,
            }
            for bs, s in self.slots.items()
        }
