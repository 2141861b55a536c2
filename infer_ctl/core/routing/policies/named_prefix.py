"""The named-prefix rule: where a request that starts with a named (pinned, replicated) prefix goes.

1. The warm replicas that are not overloaded: deepest match (a multi-turn conversation under the
   shared prompt) when it is about as idle, else the least loaded.
2. Every replica overloaded: another worker the index says holds the prefix as deeply as every
   replica (it took spilled traffic before), if it is not overloaded. The replica set grows on
   demand instead of sending the next spill to a cold worker.
3. Every holder overloaded: queue on the least-loaded holder when that costs less than recomputing
   the prefix elsewhere: its excess queue (requests above the least-loaded worker) times the
   uncached part of this request is below the prefix's length, and the excess stays under
   `spill_queue_factor` x `balance_abs`. Otherwise None: the request goes cold to the least-loaded
   worker, which from then on counts as a holder (step 2).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from infer_ctl.core.routing.policies.base import Choice, PolicyConfig, WorkerView, overloaded


def named_prefix(
    cands: Sequence[WorkerView], matches: Mapping[str, int], replicas: Sequence[str], min_load: int,
    cfg: PolicyConfig, rng: random.Random, prompt_len: int,
) -> Choice | None:
    """The choice, or None to let the cache-aware policy place the request. `matches` and `prompt_len`
    are in one unit (characters on the predicted path, tokens on the KV-events path)."""
    reps = [w for w in cands if w.url in replicas]
    ok = [w for w in reps if not overloaded(w, min_load, cfg)]
    if ok:
        return _spread(ok, matches, rng, "named_prefix")
    depth = min((matches[w.url] for w in reps), default=0)
    if depth <= 0:
        return None
    others = [w for w in cands if w.url not in replicas and matches[w.url] >= depth]
    ok = [w for w in others if not overloaded(w, min_load, cfg)]
    if ok:
        return _spread(ok, matches, rng, "named_prefix_holder")
    least = min(reps + others, key=lambda w: (w.load, rng.random()))
    excess = least.load - min_load
    uncached = max(prompt_len - matches[least.url], 1)
    if excess * uncached < matches[least.url] and excess <= cfg.spill_queue_factor * cfg.balance_abs:
        return Choice(least.url, "named_prefix_queue", matches[least.url])
    return None


def _spread(ok: Sequence[WorkerView], matches: Mapping[str, int], rng: random.Random, reason: str) -> Choice:
    best = min(ok, key=lambda w: (w.load, rng.random()))
    deepest = max(ok, key=lambda w: matches[w.url])
    if matches[deepest.url] > matches[best.url] and deepest.load <= best.load + 1:
        best = deepest
    return Choice(best.url, reason, matches[best.url])
