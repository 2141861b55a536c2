"""What the simulated draft accepts: one alpha per workload domain, drift over time, a broken draft. Pure.

A request names its domain in SGLang's own per-request label field, `custom_labels` (the body of
/generate and of the OpenAI endpoints; SGLang 0.5.23 `managers/io_struct.py` `GenerateReqInput.
custom_labels`), or in the `x-custom-labels` header as a JSON object (SGLang's
`--tokenizer-metrics-custom-labels-header` default, `entrypoints/openai/serving_base.py`
`extract_custom_labels`): `{"domain": "code"}`. A real server passes both through untouched, so a bench
run labels its requests the same way against either. Unlabelled requests (and unknown domains) take the
default domain.

Each domain's alpha is the per-draft acceptance probability of Leviathan et al.; drift changes it over
time: a schedule (`DriftStep`: at model second t since the workload was first used, the domain's alpha
becomes a) and run-time shifts (`shift`, the simulator's `POST /sim/spec/alpha`). The latest event wins.
The object is carried by the `WorkerSpec`, so a restarted worker (`SimCluster.start_worker`) keeps the
shifts and the schedule's clock: the workload did not change because the server restarted.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: unlabelled requests, at the timing preset's `spec_alpha` (or `--spec-alpha`)
DEFAULT_DOMAIN = "default"
#: per-domain acceptance of an EAGLE-class draft (the sizing tables' figures)
DOMAIN_ALPHAS: dict[str, float] = {
    "json": 0.88,
    "code": 0.88,
    "summarisation": 0.76,
    "chat": 0.68,
    "creative": 0.42,
}
DOMAIN_ALIASES = {"summarization": "summarisation"}
#: a draft whose token ids mean other tokens than the target's (or whose special tokens differ) agrees
#: with the target only by accident
MISMATCH_ALPHA = 0.01
#: the label key in custom_labels that names the domain
DOMAIN_LABEL = "domain"
CUSTOM_LABELS_HEADER = "x-custom-labels"


def _check_alpha(alpha: Any, what: str) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"{what}: alpha must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def normalise_domain(name: str) -> str:
    key = name.strip().lower()
    return DOMAIN_ALIASES.get(key, key)


@dataclass(frozen=True)
class DriftStep:
    """At `at_s` model seconds after the workload's first use, `domain`'s alpha becomes `alpha`."""

    at_s: float
    domain: str
    alpha: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.at_s) or self.at_s < 0:
            raise ValueError(f"drift step time must be >= 0 seconds, got {self.at_s}")
        object.__setattr__(self, "domain", normalise_domain(self.domain))
        _check_alpha(self.alpha, f"drift step {self.domain}@{self.at_s}")


def parse_domain_alpha(text: str) -> tuple[str, float]:
    """`DOMAIN=ALPHA`, e.g. `code=0.9` (the `sim serve --spec-domain` syntax)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"bad domain alpha {text!r}: expected DOMAIN=ALPHA, e.g. code=0.88")
    try:
        alpha = float(value)
    except ValueError:
        raise ValueError(f"bad domain alpha {text!r}: {value!r} is not a number") from None
    return normalise_domain(name), _check_alpha(alpha, f"domain {name.strip()}")


def parse_drift(text: str) -> DriftStep:
    """`SECONDS:DOMAIN=ALPHA`, e.g. `30:chat=0.4` (the `sim serve --spec-drift` syntax)."""
    at, sep, rest = text.partition(":")
    if not sep:
        raise ValueError(f"bad drift step {text!r}: expected SECONDS:DOMAIN=ALPHA, e.g. 30:chat=0.4")
    try:
        at_s = float(at)
    except ValueError:
        raise ValueError(f"bad drift step {text!r}: {at!r} is not a number of seconds") from None
    domain, alpha = parse_domain_alpha(rest)
    return DriftStep(at_s, domain, alpha)


def domain_of(custom_labels: Mapping[str, Any] | None) -> str | None:
    """The domain a request's custom_labels name, or None."""
    if not custom_labels:
        return None
    value = custom_labels.get(DOMAIN_LABEL)
    return normalise_domain(value) if isinstance(value, str) and value.strip() else None


@dataclass
class SpecWorkload:
    """The acceptance behaviour of one worker's draft on its traffic (see the module docstring)."""

    #: domain -> alpha (the built-in figures, then these); "default" is the timing preset's spec_alpha
    domains: dict[str, float] = field(default_factory=dict)
    #: the domain of unlabelled requests; None = "default" (the preset's / --spec-alpha)
    default_domain: str | None = None
    drift: tuple[DriftStep, ...] = ()
    #: the draft's tokenizer (or special tokens) differs from the target's: ~0 acceptance everywhere
    draft_tokenizer_mismatch: bool = False
    #: run-time shifts: domain -> (time.monotonic() of the shift, alpha)
    shifts: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: time.monotonic() of the first use: the schedule's time zero (kept across worker restarts)
    epoch: float | None = None

    def __post_init__(self) -> None:
        self.domains = {normalise_domain(k): _check_alpha(v, f"domain {k}") for k, v in self.domains.items()}
        if self.default_domain is not None:
            self.default_domain = normalise_domain(self.default_domain)
        self.drift = tuple(sorted(self.drift, key=lambda s: s.at_s))

    def copy(self) -> SpecWorkload:
        """An independent workload with the same settings (one per worker of `sim serve`)."""
        return copy.deepcopy(self)

    def start(self, now: float | None = None) -> None:
        if self.epoch is None:
            self.epoch = time.monotonic() if now is None else now

    def known(self, base_alpha: float) -> dict[str, float]:
        """Configured alpha per domain (before drift): the built-in figures, overrides, "default"."""
        return {**DOMAIN_ALPHAS, DEFAULT_DOMAIN: base_alpha, **self.domains}

    def resolve(self, domain: str | None) -> str:
        """The domain a request is accounted to: its label if known, else the default domain."""
        if domain and (
            domain in DOMAIN_ALPHAS
            or domain in self.domains
            or domain in self.shifts
            or domain == DEFAULT_DOMAIN
            or any(s.domain == domain for s in self.drift)
        ):
            return domain
        return self.default_domain or DEFAULT_DOMAIN

    def alpha(self, domain: str, base_alpha: float, now: float, time_scale: float) -> float:
        """`domain`'s alpha at time.monotonic() `now` (time_scale: wall seconds per model second)."""
        if self.draft_tokenizer_mismatch:
            return MISMATCH_ALPHA
        configured = self.known(base_alpha)
        alpha = configured.get(domain, configured[DEFAULT_DOMAIN])
        latest = -math.inf
        epoch = self.epoch if self.epoch is not None else now
        for step in self.drift:
            at = epoch + step.at_s * time_scale
            if at > now:
                break
            if step.domain == domain:
                latest, alpha = at, step.alpha
        shifted = self.shifts.get(domain)
        if shifted is not None and shifted[0] >= latest:
            alpha = shifted[1]
        return alpha

    def shift(self, domain: str, alpha: float, now: float | None = None) -> None:
        """From now on `domain` accepts with `alpha` (until a later drift step or shift)."""
        name = normalise_domain(domain)
        if not name:
            raise ValueError("domain must be a non-empty name")
        self.shifts[name] = (time.monotonic() if now is None else now, _check_alpha(alpha, f"domain {name}"))

    def snapshot(self, base_alpha: float, now: float, time_scale: float) -> dict[str, Any]:
        """What `GET /sim/spec` reports: the current alpha of every domain and the settings behind it."""
        names = {*self.known(base_alpha), *(s.domain for s in self.drift), *self.shifts}
        elapsed = (now - self.epoch) / time_scale if self.epoch is not None else 0.0
        return {
            "default_domain": self.default_domain or DEFAULT_DOMAIN,
            "draft_tokenizer_mismatch": self.draft_tokenizer_mismatch,
            "alpha": {d: self.alpha(d, base_alpha, now, time_scale) for d in sorted(names)},
            "configured": dict(sorted(self.known(base_alpha).items())),
            "drift": [{"at_s": s.at_s, "domain": s.domain, "alpha": s.alpha} for s in self.drift],
            "elapsed_s": elapsed,
        }


def labels_from_header(value: str | None) -> dict[str, str] | None:
    """The `x-custom-labels` header: a JSON object of string labels (anything else: no labels, as
    SGLang's extract_custom_labels logs and ignores a bad header)."""
    if not value:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if isinstance(parsed, dict):
        return {k: v for k, v in parsed.items() if isinstance(k, str) and isinstance(v, str)} or None
    return None
