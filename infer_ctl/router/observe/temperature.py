"""Speculative requests by sampling temperature band (the seed's anti-pattern: a long lookahead, gamma >= 6,
served to high-temperature traffic, where the target's sampled tokens rarely match the draft's and every
drafted token past the first rejection is wasted work).

The router sees each request's temperature: `/generate`'s `sampling_params.temperature`, the OpenAI
endpoints' top-level `temperature`. A request without one samples at SGLang 0.5.23's default, 1.0
(srt/sampling/sampling_params.py `temperature: float = 1.0`; the OpenAI endpoints fall back to the model's
generation_config, else `_DEFAULT_SAMPLING_PARAMS["temperature"]` = 1.0 in entrypoints/openai/protocol.py),
so it is counted as 1.0 - that is what the worker samples with, unless the model's generation_config says
otherwise, which the router cannot see.

Per decode the router keeps the all-time count per band (the Prometheus counter
`inferctl_router_spec_requests_total{decode,temperature_band}`) and the bands of the last `window`
requests (`check spec` judges the recent share, so that traffic that changed is not judged on the old).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

#: the band label values, in order (metrics, /admin/spec, check spec)
BANDS = ("0", "0-0.7", "0.7-1.2", ">1.2")
HIGH = ">1.2"
#: SGLang's own default when a request names none (see the module docstring)
DEFAULT_TEMPERATURE = 1.0
#: SGLang treats a temperature below this as greedy (sampling_params.py _SAMPLING_EPS)
_GREEDY_EPS = 1e-6


def temperature_of(body: Mapping[str, Any]) -> float:
    """The temperature the worker samples this request with. A native `/generate` body (text, input_ids or
    sampling_params; no OpenAI `messages`/`prompt`) reads its sampling_params: SGLang ignores a top-level
    temperature there."""
    native = "messages" not in body and "prompt" not in body
    src = body.get("sampling_params") if native else body
    t = src.get("temperature") if isinstance(src, Mapping) else None
    if isinstance(t, int | float) and not isinstance(t, bool):
        return float(t)
    return DEFAULT_TEMPERATURE


def band_of(t: float) -> int:
    """The index in BANDS of temperature `t` (upper bounds inclusive: 0.7 is in 0-0.7, 1.2 in 0.7-1.2)."""
    if t < _GREEDY_EPS:
        return 0
    if t <= 0.7:
        return 1
    if t <= 1.2:
        return 2
    return 3


class TemperatureBands:
    """All-time counts per band and the bands of the last `window` requests (O(1) per request)."""

    __slots__ = ("recent", "ring", "totals", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.totals = [0] * len(BANDS)
        self.recent = [0] * len(BANDS)
        self.ring: deque[int] = deque()

    def add(self, band: int) -> None:
        self.totals[band] += 1
        if len(self.ring) >= self.window:
            self.recent[self.ring.popleft()] -= 1
        self.ring.append(band)
        self.recent[band] += 1

    def restart(self) -> None:
        """The decode restarted: the window starts again (the totals are a counter and only grow)."""
        self.recent = [0] * len(BANDS)
        self.ring.clear()

    def as_dict(self) -> dict[str, Any]:
        return {"window": dict(zip(BANDS, self.recent, strict=True)),
                "total": dict(zip(BANDS, self.totals, strict=True))}
