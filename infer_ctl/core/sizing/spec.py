"""Speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", eq. 1 and Theorem 3.8): with per-token acceptance rate a and lookahead g,

    E[N] = (1 - a^(g+1)) / (1 - a)      tokens produced per verification step (g + 1 when a = 1)
    S    = E[N] / (g*c + 1)             walltime speedup, c = draft step cost / target step cost
"""

from __future__ import annotations

from dataclasses import dataclass


def _check(alpha: float, gamma: int, cost_ratio: float | None = None) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if cost_ratio is not None and cost_ratio < 0:
        raise ValueError(f"cost ratio must be >= 0, got {cost_ratio}")


def expected_tokens(alpha: float, gamma: int) -> float:
    _check(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    # The geometric series written as a sum is exact at the edges and avoids 0/0 near alpha = 1.
    if alpha > 0.999:
        return float(sum(alpha**i for i in range(gamma + 1)))
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    _check(alpha, gamma, cost_ratio)
    return expected_tokens(alpha, gamma) / (gamma * cost_ratio + 1.0)


def break_even_alpha(gamma: int, cost_ratio: float) -> float | None:
    """Smallest alpha with S >= 1, or None when no alpha < 1 reaches it (c >= 1 with g >= 1).

    E[N] rises monotonically from 1 (a = 0) to g + 1 (a = 1), so bisection on E[N] = g*c + 1 converges.
    """
    _check(0.0, gamma, cost_ratio)
    target = gamma * cost_ratio + 1.0
    if target <= 1.0:
        return 0.0
    if target > gamma + 1:
        return None
    if target == gamma + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if expected_tokens(mid, gamma) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return hi


@dataclass(frozen=True)
class SpecPlan:
    alpha: float
    gamma: int
    cost_ratio: float
    expected_tokens: float
    speedup: float
    break_even_alpha: float | None


def plan_spec(alpha: float, gamma: int, cost_ratio: float) -> SpecPlan:
    return SpecPlan(
        alpha=alpha,
        gamma=gamma,
        cost_ratio=cost_ratio,
        expected_tokens=expected_tokens(alpha, gamma),
        speedup=speedup(alpha, gamma, cost_ratio),
        break_even_alpha=break_even_alpha(gamma, cost_ratio),
    )


def speedup_table(alphas: list[float], gammas: list[int], cost_ratio: float) -> list[list[float]]:
    """Rows by alpha, columns by gamma."""
    return [[speedup(a, g, cost_ratio) for g in gammas] for a in alphas]
