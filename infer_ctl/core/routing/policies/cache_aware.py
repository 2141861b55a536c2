"""cache_aware: prefix-cache-aware placement.

The prompt's blocks are matched against the index; the worker holding the longest match wins when the
match covers `cache_threshold` of the prompt and the worker is not overloaded (base.overloaded). With the
workers' KV events (ScoreInputs, every count in tokens) the qualifying holders are scored instead
(`score`). Equally good holders are ordered by the prompt's rendezvous order with `miss_placement`
"rendezvous" (placement.py), else at random: on both paths.

A miss (no worker holds the prompt: a new prefix, or one evicted) falls back, with `miss_placement`
"power_of_two" (the default), to power-of-two choices over (load, predicted cache footprint), so new
prefixes land on the less-loaded, emptier worker: that keeps each worker's working set small under cache
pressure. With "rendezvous" it goes to the prompt's home (placement.py). A badly imbalanced pool (some
worker overloaded) still sends misses to the least-loaded, emptier worker ("balance"). Rendezvous is not
the default: in the simulated stale and steady benchmarks it gained no hit rate over power-of-two and cost
TTFT (docs/benchmarks.md, "Rendezvous placement of new prefixes").
"""

from __future__ import annotations

from collections.abc import Mapping

from infer_ctl.core.routing.policies.base import Choice, PrefillRequest, WorkerView, overloaded
from infer_ctl.core.routing.policies.named_prefix import named_prefix
from infer_ctl.core.routing.policies.placement import home, rendezvous_rank
from infer_ctl.core.routing.policies.power_of_two import power_of_two


def score(*, prompt_tokens: int, cached_tokens: int, load: int, queue_cost_tokens: float) -> float:
    """A holder's cost, lowest first, as Dynamo's KV router scores workers (overlap minus load): the prompt
    tokens left to compute there plus `queue_cost_tokens` per request already on the worker (what waiting
    behind one request costs, in prefill work)."""
    return prompt_tokens - cached_tokens + queue_cost_tokens * load


class CacheAware:
    def choose(self, req: PrefillRequest) -> Choice:
        cands, cfg, rng, tokens = req.cands, req.cfg, req.rng, req.tokens
        min_load = min(w.load for w in cands)
        rv = req.key if cfg.miss_placement == "rendezvous" else None

        def tie(w: WorkerView) -> float:  # among equals: the key's rendezvous order, else random
            return -rendezvous_rank(rv, w.url) if rv is not None else rng.random()

        matches: Mapping[str, int]
        if tokens is not None:
            matches = {w.url: tokens.cached_tokens.get(w.url, 0) for w in cands}
            prompt_len = tokens.prompt_tokens
        else:
            assert req.prefix_index is not None
            matches = req.prefix_index.match(req.hashes, [w.url for w in cands], req.now)
            prompt_len = req.text_chars
        if req.replicas:
            named = named_prefix(cands, matches, req.replicas, min_load, cfg, rng, prompt_len)
            if named is not None:
                return named

        need = cfg.cache_threshold * max(prompt_len, 1)
        if tokens is not None:
            per_request = tokens.queue_cost_tokens if tokens.queue_cost_tokens is not None else max(prompt_len, 1)
            holders = [w for w in cands if matches[w.url] > 0 and matches[w.url] >= need
                       and not overloaded(w, min_load, cfg)]
            if holders:
                best = min(holders, key=lambda w: (score(prompt_tokens=prompt_len, cached_tokens=matches[w.url],
                                                         load=w.load, queue_cost_tokens=per_request), tie(w)))
                return Choice(best.url, "cache_hit", matches[best.url])
        else:
            for w in sorted(cands, key=lambda w: (-matches[w.url], w.load, tie(w))):
                m = matches[w.url]
                if m == 0 or m < need:
                    break
                if not overloaded(w, min_load, cfg):
                    return Choice(w.url, "cache_hit", m)
        return _miss(req, matches, min_load)


def _miss(req: PrefillRequest, matches: Mapping[str, int], min_load: int) -> Choice:
    cands, cfg, rng = req.cands, req.cfg, req.rng
    size: Mapping[str, int]
    if req.footprint is not None:
        size = req.footprint
    elif req.tokens is not None and req.tokens.footprint_chars is not None:
        size = req.tokens.footprint_chars
    else:
        assert req.prefix_index is not None
        size = {w.url: req.prefix_index.footprint(w.url) for w in cands}
    busiest = max(cands, key=lambda w: w.load)
    if overloaded(busiest, min_load, cfg):
        least = [w for w in cands if w.load == min_load]
        pick = min(least, key=lambda w: (size.get(w.url, 0), rng.random()))
        return Choice(pick.url, "balance", matches[pick.url])
    if cfg.miss_placement == "rendezvous" and req.key is not None:
        pick = home(cands, req.key, cfg)
        return Choice(pick.url, "home", matches[pick.url])
    pick = power_of_two(cands, rng, size)
    return Choice(pick.url, "fallback", matches[pick.url])
