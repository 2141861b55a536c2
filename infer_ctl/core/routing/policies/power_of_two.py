"""power_of_two: two random candidates, the less loaded (then the emptier cache) wins."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from infer_ctl.core.routing.policies.base import Choice, PrefillRequest, WorkerView


def power_of_two(
    cands: Sequence[WorkerView], rng: random.Random, footprint: Mapping[str, int] | None = None
) -> WorkerView:
    if len(cands) == 1:
        return cands[0]
    a, b = rng.sample(list(cands), 2)
    fa = footprint.get(a.url, 0) if footprint else 0
    fb = footprint.get(b.url, 0) if footprint else 0
    return a if (a.load, fa) <= (b.load, fb) else b


class PowerOfTwo:
    def choose(self, req: PrefillRequest) -> Choice:
        return Choice(power_of_two(req.cands, req.rng).url, "power_of_two")
