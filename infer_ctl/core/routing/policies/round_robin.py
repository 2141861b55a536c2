"""round_robin: the candidates in turn, by the router's decision counter."""

from __future__ import annotations

from infer_ctl.core.routing.policies.base import Choice, PrefillRequest


class RoundRobin:
    def choose(self, req: PrefillRequest) -> Choice:
        return Choice(req.cands[req.seq % len(req.cands)].url, "round_robin")
