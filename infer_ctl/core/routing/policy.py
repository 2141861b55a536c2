"""Worker selection as a pure function of snapshots (docs/architecture.md: routing is tested without sockets).

Prefill: one policy by name (`PolicyConfig.policy`), each a module of core/routing/policies behind one
interface (`PrefillPolicy`): round_robin, random, power_of_two, cache_aware (the default: prefix-cache-aware,
with the named-prefix rule and the placement of prompts no worker holds; policies/cache_aware.py says how).

Decode: least loaded, ties broken at random (or round robin), preferring decodes with room for the request's
KV and those NVLink-connected to its prefill.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.policies.base import (
    Choice,
    NoWorkerAvailable,
    PolicyConfig,
    PrefillPolicy,
    PrefillRequest,
    WorkerView,
    available,
    overloaded,
)
from infer_ctl.core.routing.policies.cache_aware import CacheAware
from infer_ctl.core.routing.policies.placement import (
    MISS_PLACEMENTS,
    PLACEMENT_KEY_CHARS,
    home,
    placement_key,
    rendezvous_rank,
)
from infer_ctl.core.routing.policies.power_of_two import PowerOfTwo, power_of_two
from infer_ctl.core.routing.policies.random_choice import RandomChoice
from infer_ctl.core.routing.policies.round_robin import RoundRobin
from infer_ctl.core.routing.units import ScoreInputs

__all__ = [
    "MISS_PLACEMENTS", "NEAR_SLACK", "PLACEMENT_KEY_CHARS", "POLICIES", "Choice", "NoWorkerAvailable", "PolicyConfig",
    "PrefillPolicy", "WorkerView", "choose_decode", "choose_prefill", "home", "overloaded", "placement_key",
    "power_of_two", "rendezvous_rank",
]

#: the prefill policies by the name `PolicyConfig.policy` (and the router's `policy` setting, profile/router.py
#: PolicyName: the same names, tests/router/test_router_settings.py) gives them
POLICIES: dict[str, PrefillPolicy] = {
    "round_robin": RoundRobin(),
    "random": RandomChoice(),
    "power_of_two": PowerOfTwo(),
    "cache_aware": CacheAware(),
}
#: requests a decode NVLink-connected to the prefill may carry above the least loaded one and still be chosen
NEAR_SLACK = 2


def choose_prefill(
    *,
    hashes: Sequence[int],
    text_chars: int,
    workers: Sequence[WorkerView],
    index: PrefixIndex,
    now: float,
    cfg: PolicyConfig,
    rng: random.Random,
    seq: int = 0,
    replicas: Sequence[str] | None = None,
    tokens: ScoreInputs | None = None,
    footprint: Mapping[str, int] | None = None,
    key: bytes | None = None,
) -> Choice:
    """Pick the prefill (or collocated) worker among the available `workers`. `replicas`: the warm replicas
    of a named prefix the request starts with; traffic is spread over them instead of hot-spotting the best
    match. `tokens` (the KV-events path): the cache-aware score's inputs in tokens (core/routing/units.py);
    None: the predicted index's match in characters. `footprint`: cached characters per worker for the
    fallback's tie-break (default: the `tokens`' or the predicted index's). Unknown policy names take
    cache_aware (the config validates them)."""
    req = PrefillRequest(available(workers), cfg, rng, seq, hashes, text_chars, index, now, replicas, tokens,
                         footprint, key)
    return POLICIES.get(cfg.policy, POLICIES["cache_aware"]).choose(req)


def choose_decode(workers: Sequence[WorkerView], rng: random.Random, *, policy: str = "load", seq: int = 0,
                  need: int | None = None, near: Collection[str] | None = None) -> Choice:
    """`need`: the KV tokens the request may grow to (prompt + max tokens): a decode whose free KV cannot
    hold it is not chosen while another can (SGLang would retract running requests there to make room, and
    each retraction costs a recompute or a host round trip); when none can, the policy chooses among all."""
    cands = available(workers)
    if need is not None:
        room = [w for w in cands if w.kv_free is None or w.kv_free >= need]
        cands = room or cands
    if near:
        # `near`: the decodes NVLink-connected to the request's prefill: preferred while about as loaded as
        # the least loaded decode (a transfer over NVLink instead of the NICs is not worth a longer batch)
        close = [w for w in cands if w.url in near]
        if close and min(w.load for w in close) <= min(w.load for w in cands) + NEAR_SLACK:
            cands = close
    if policy == "round_robin":
        return Choice(cands[seq % len(cands)].url, "round_robin")
    least = min(w.load for w in cands)
    pick = rng.choice([w for w in cands if w.load == least])
    return Choice(pick.url, "load")
