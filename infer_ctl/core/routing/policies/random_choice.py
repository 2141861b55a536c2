"""random: a uniformly random candidate."""

from __future__ import annotations

from infer_ctl.core.routing.policies.base import Choice, PrefillRequest


class RandomChoice:
    def choose(self, req: PrefillRequest) -> Choice:
        return Choice(req.rng.choice(req.cands).url, "random")
