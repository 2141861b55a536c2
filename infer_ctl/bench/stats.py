"""Per-request results and the summary of a run. Pure."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from infer_ctl.core.routing.spec_fields import SpecFields, SpecTally


@dataclass
class RequestResult:
    index: int
    tenant: str
    ok: bool
    start: float  # seconds since the run started (wall)
    ttft: float | None = None  # model seconds (wall / time_scale)
    e2e: float | None = None
    itls: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    #: the connection itself failed (refused, unresolvable, no route): nothing listens at the URL
    unreachable: bool = False
    #: SGLang's speculative fields of the finishing chunk (core/routing/spec_fields.py), when it had them
    spec: SpecFields | None = None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (SGLang's TPOT)."""
        if self.e2e is None or self.ttft is None or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)


def percentile(values: list[float], p: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), p in [0, 100]."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    if lo == hi:
        return xs[int(k)]
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _dist(values: list[float]) -> dict[str, float | None]:
    return {
        "mean": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


@dataclass(frozen=True)
class Slo:
    ttft_s: float = 2.0
    tpot_s: float = 0.1


def summarize(results: list[RequestResult], duration_s: float, slo: Slo, time_scale: float = 1.0) -> dict[str, Any]:
    """`duration_s` is wall time; throughputs are per model second (wall / time_scale)."""
    ok = [r for r in results if r.ok]
    model_duration = duration_s / time_scale if duration_s > 0 else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    good = [
        r for r in ok
        if r.ttft is not None and r.ttft <= slo.ttft_s and (r.tpot is None or r.tpot <= slo.tpot_s)
    ]
    per_s = (lambda n: n / model_duration) if model_duration > 0 else (lambda n: 0.0)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            # whole: cut at 120 characters, a connection error ended at "[Connec" and hid the reason.
            # Messages are bounded where they are made (an HTTP body at 300 characters)
            key = r.error or "error"
            errors[key] = errors.get(key, 0) + 1
    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": round(duration_s, 3),  # as every report's: float noise (0.006999...) is not data
        "model_duration_s": round(model_duration, 3),
        "time_scale": time_scale,
        "ttft_s": _dist([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": _dist([x for r in ok for x in r.itls]),
        "tpot_s": _dist([t for r in ok if (t := r.tpot) is not None]),
        "e2e_s": _dist([r.e2e for r in ok if r.e2e is not None]),
        "request_throughput": per_s(len(ok)),
        "input_token_throughput": per_s(prompt),
        "output_token_throughput": per_s(completion),
        "goodput": per_s(len(good)),
        "slo": asdict(slo),
        "slo_attainment": len(good) / len(results) if results else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        "errors": errors,
        "speculative": speculative_summary(ok),
    }


def speculative_summary(ok: list[RequestResult]) -> dict[str, Any] | None:
    """Accept length (completion tokens / verify steps) and accept rate (correct / proposed drafts) over
    the run, as SGLang reports them, and the estimated per-draft alpha; None when no answer carried them."""
    tally = SpecTally()
    tally.extend(r.spec for r in ok)
    if not tally.requests:
        return None
    return {"requests": tally.requests, "verify_ct": tally.verify_ct, "accept_length": tally.accept_length,
            "accept_rate": tally.accept_rate, "alpha": tally.alpha}


def hit_rate_over_time(results: list[RequestResult], bins: int = 20) -> list[tuple[float, float]]:
    """(bin start in wall seconds, cached/prompt tokens of requests started in the bin)."""
    ok = [r for r in results if r.ok]
    if not ok:
        return []
    end = max(r.start for r in ok) or 1.0
    width = end / bins if end > 0 else 1.0
    acc = [[0, 0] for _ in range(bins)]
    for r in ok:
        b = min(bins - 1, int(r.start / width)) if width else 0
        acc[b][0] += r.cached_tokens
        acc[b][1] += r.prompt_tokens
    return [(i * width, c / p) for i, (c, p) in enumerate(acc) if p]
