"""What a measured acceptance means for one decode pool, from the speedup formula of `core.sizing.spec`
(Leviathan et al. 2023): S(alpha, gamma, c) = E[tokens per verify step] / (gamma*c + 1).

- the recommended step count is the argmax of S over the steps the operator allows (ties: the smaller
  gamma, which costs less draft compute and memory for the same speedup);
- the break-even alpha of the running step count is the alpha below which speculation is slower than no
  speculation at all (S < 1): below it the pool FAILs;
- below the alert threshold (the checklist's 0.5 by default) it WARNs, naming the recommended gamma;
- an alpha near 0 is the signature of a draft whose tokenizer or special tokens differ from the
  target's (every draft token means something else), not of domain drift: the finding says to compare
  the pair with `inferctl check tokenizer`.

alpha is the per-draft acceptance probability (SGLang does not report it; `core.routing.spec_fields`
estimates it from the accepted-drafts histogram). Pure: numbers in, numbers and findings out.
"""

from __future__ import annotations

from dataclasses import dataclass

from infer_ctl.core.findings import Finding
from infer_ctl.core.sizing.spec import break_even_alpha, speedup

CHECK = "spec.acceptance"
#: below this alpha a draft agrees with the target only by accident (a mismatched tokenizer gives ~0.01)
NEAR_ZERO_ALPHA = 0.05


@dataclass(frozen=True)
class SpecLimits:
    """The operator's limits for one pool (profile `speculative:`, per pool where set)."""

    alert_threshold: float = 0.5
    cost_ratio: float = 0.1
    min_steps: int = 1
    max_steps: int = 8

    def __post_init__(self) -> None:
        if not 0.0 < self.alert_threshold < 1.0:
            raise ValueError(f"alert threshold must be in (0, 1), got {self.alert_threshold}")
        if self.cost_ratio < 0:
            raise ValueError(f"cost ratio must be >= 0, got {self.cost_ratio}")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ValueError(f"need 1 <= min_steps <= max_steps, got {self.min_steps}..{self.max_steps}")

    @property
    def allowed_steps(self) -> range:
        return range(self.min_steps, self.max_steps + 1)


def recommend_steps(alpha: float, cost_ratio: float, allowed: range) -> tuple[int, float]:
    """(gamma, S) maximising S over `allowed`; the smaller gamma on a tie."""
    best_g, best_s = allowed[0], speedup(alpha, allowed[0], cost_ratio)
    for g in allowed[1:]:
        s = speedup(alpha, g, cost_ratio)
        if s > best_s * (1 + 1e-9):
            best_g, best_s = g, s
    return best_g, best_s


@dataclass(frozen=True)
class Assessment:
    alpha: float
    steps: int
    cost_ratio: float
    #: S at the running step count
    speedup: float
    recommended_steps: int
    recommended_speedup: float
    #: alpha at which the running step count breaks even (None: never, c >= 1)
    break_even_alpha: float | None
    #: the lowest break-even over the allowed steps (that of the smallest): below it no allowed step
    #: count pays, only disabling speculation or another draft does
    floor_alpha: float | None
    status: str  # ok | warn | fail
    near_zero: bool
    alert_threshold: float = 0.5

    @property
    def gain(self) -> float:
        """Expected throughput ratio of the recommended over the running step count."""
        return self.recommended_speedup / self.speedup if self.speedup > 0 else float("inf")

    def as_dict(self) -> dict[str, object]:
        return {
            "alpha": round(self.alpha, 4), "steps": self.steps, "cost_ratio": self.cost_ratio,
            "speedup": round(self.speedup, 4), "recommended_steps": self.recommended_steps,
            "recommended_speedup": round(self.recommended_speedup, 4),
            "break_even_alpha": None if self.break_even_alpha is None else round(self.break_even_alpha, 4),
            "floor_alpha": None if self.floor_alpha is None else round(self.floor_alpha, 4),
            "alert_threshold": self.alert_threshold, "status": self.status,
        }


def assess(alpha: float, steps: int, limits: SpecLimits) -> Assessment:
    """Judge one measured alpha at the running step count `steps` (>= 1)."""
    alpha = min(1.0, max(0.0, alpha))
    c = limits.cost_ratio
    s_now = speedup(alpha, steps, c)
    rec, s_rec = recommend_steps(alpha, c, limits.allowed_steps)
    be = break_even_alpha(steps, c)
    floor = break_even_alpha(limits.min_steps, c)
    slower = be is None or alpha < be
    status = "fail" if slower or alpha < NEAR_ZERO_ALPHA else "warn" if alpha < limits.alert_threshold else "ok"
    return Assessment(alpha, steps, c, s_now, rec, s_rec, be, floor, status, alpha < NEAR_ZERO_ALPHA,
                      limits.alert_threshold)


def _pct(x: float) -> str:
    return f"{x:.2f}"


def acceptance_finding(node: str, subject: str, a: Assessment, *, requests: int, pair: str = "",
                       tokenizer_hint: str | None = None, source: str = "router") -> Finding:
    """The `spec.acceptance` finding of one decode (or pool) from its assessment: the verdict first, then
    the numbers behind it (alpha, requests, steps, speedup, break-even), then the draft/target pair."""
    be = "never" if a.break_even_alpha is None else _pct(a.break_even_alpha)
    numbers = (f"alpha {_pct(a.alpha)} over {requests} requests at {a.steps} steps: speedup {a.speedup:.2f}x, "
               f"break-even alpha {be}")
    tail = f"; {pair}" if pair else ""
    details = {**a.as_dict(), "requests": requests, "pair": pair, "source": source}
    rec = a.recommended_steps
    if a.near_zero:
        msg = (f"the draft agrees with the target only by accident ({numbers}), the signature of a tokenizer or "
               f"special-token mismatch between draft and target{tail}")
        if tokenizer_hint:
            msg += f"; last tokenizer check: {tokenizer_hint}"
        return Finding.fail(CHECK, node, subject, msg, details=details,
                            remedy="run `inferctl check tokenizer` for this draft/target pair; until it passes, "
                                   "disable speculation or change the draft")
    if a.status == "fail":
        pays = a.recommended_speedup > 1.0 and rec != a.steps
        fix = f"set num_steps {rec} (expected {a.recommended_speedup:.2f}x), or " if pays else ""
        return Finding.fail(CHECK, node, subject, f"speculation is now slower than none: {numbers}{tail}",
                            details=details, remedy=f"{fix}disable speculation or change the draft")
    if a.status == "warn":
        if rec != a.steps:
            advice = f"recommended gamma {rec} (num_steps {rec}: expected {a.recommended_speedup:.2f}x)"
            remedy = (f"lower the lookahead to num_steps {rec} (with speculative.control: advise, `inferctl spec "
                      "control` prints the profile change and the command), or find what shifted the workload")
        else:
            advice = f"gamma {rec} is already the best allowed step count"
            remedy = "the draft no longer fits this traffic: consider another draft"
        return Finding.warn(CHECK, node, subject,
                            f"alpha below the alert threshold {a.alert_threshold:g}, {advice}: {numbers}{tail}",
                            details=details, remedy=remedy)
    return Finding.ok(CHECK, node, subject,
                      f"{numbers}; best allowed gamma {rec} ({a.recommended_speedup:.2f}x){tail}", details=details)
