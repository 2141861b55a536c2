"""Worker selection as a pure function of snapshots (docs/architecture.md: routing is tested without sockets).

Prefill: prefix-cache-aware. The prompt's blocks are matched against the index; the worker holding the
longest match wins when the match covers `cache_threshold` of the prompt and the worker is not
overloaded (load guard: more than `balance_abs` above the least-loaded worker *and* more than
`balance_rel` times it, as sglang-router does). Equally good holders are ordered by the prompt's
rendezvous order with `miss_placement` "rendezvous" (below), else at random.

A miss (no worker holds the prompt: a new prefix, or one evicted) falls back, with `miss_placement`
"power_of_two" (the default), to power-of-two choices over (load, predicted cache footprint), so new
prefixes land on the less-loaded, emptier worker: that keeps each worker's working set small under cache
pressure; ties among holders are broken at random. With "rendezvous" it goes to the prompt's *home*: rendezvous (highest-random-weight) hashing of a
stable key, the first `PLACEMENT_KEY_CHARS` characters of the routing text (`placement_key`:
blake2b, the same in every router process and replica, unlike Python's per-process `hash()`), among
the available workers whose load is within `miss_slack` requests (or `miss_slack_rel` of the least
load, whichever is more) of the least-loaded one; a hot home spills to the next worker in the key's
rendezvous order. So every process and replica places a burst of one new prefix on one worker instead of
each on its own random one, and removing a worker moves only the keys it was home to. A badly imbalanced
pool (some worker overloaded) still sends misses to the least-loaded, emptier worker ("balance"), and
equally good holders are ordered by the key's rendezvous order. Not the default: in the simulated
stale and steady benchmarks it gained no hit rate over power-of-two and cost TTFT (docs/benchmarks.md,
"Rendezvous placement of new prefixes").

Decode: least loaded, ties broken at random.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from infer_ctl.core.routing.index import PrefixIndex


@dataclass(frozen=True)
class WorkerView:
    """What the policy may know about a worker at decision time."""

    url: str
    #: requests this router has in flight on the worker
    inflight: int = 0
    #: requests other clients have on the worker (from /v1/loads: reported waiting + running minus this
    #: router's in-flight at the time of the poll)
    queued: int = 0
    #: healthy and its circuit breaker lets requests through
    available: bool = True
    #: a decode's free KV tokens as the router estimates them (router/fleet/workers.py `kv_free`); None: unknown
    kv_free: int | None = None

    @property
    def load(self) -> int:
        return self.inflight + self.queued


@dataclass(frozen=True)
class PolicyConfig:
    """The router's settings the policy reads, without defaults: router/config.py `policy_config` builds
    it from the settings (the profile's router section, profile/router.py, declares them and their bounds)."""

    policy: str
    cache_threshold: float
    balance_abs: int
    balance_rel: float
    #: where a prompt no worker holds goes: power_of_two (two random workers, the less loaded and
    #: emptier) or rendezvous (its home by a stable hash, bounded load)
    miss_placement: str
    #: named prefixes: the most excess queue (in units of balance_abs) a holder may take before traffic
    #: spills to a cold worker, when queueing is still cheaper than recomputing the prefix there
    spill_queue_factor: float = 2.0
    #: rendezvous: a home this many requests above the least-loaded worker (or `miss_slack_rel` times
    #: its load, whichever is more) still takes the miss; above, the next worker in the key's order does
    miss_slack: int = 2
    miss_slack_rel: float = 0.25


#: characters of the routing text the placement key covers (docs/router.md "Routing policy": long
#: enough that unrelated prompts rarely share it, short enough to sit inside a system prompt; a prompt
#: shorter than this is keyed on all of it)
PLACEMENT_KEY_CHARS = 1024
#: requests a decode NVLink-connected to the prefill may carry above the least loaded one and still be chosen
NEAR_SLACK = 2


def placement_key(text: str, chars: int = PLACEMENT_KEY_CHARS) -> bytes | None:
    """The prompt's stable placement key: a digest of its first `chars` characters, identical in every
    process and replica (no PYTHONHASHSEED); None for an empty prompt."""
    if not text:
        return None
    return hashlib.blake2b(text[:chars].encode("utf-8", "surrogatepass"), digest_size=16).digest()


def rendezvous_rank(key: bytes, url: str) -> int:
    """The worker's weight for `key` (highest first): a hash of both, so each key orders the workers
    independently and dropping one worker moves only the keys whose first choice it was."""
    return int.from_bytes(hashlib.blake2b(key + url.encode(), digest_size=8).digest(), "big")


def home(cands: Sequence[WorkerView], key: bytes, cfg: PolicyConfig) -> WorkerView:
    """The first worker in the key's rendezvous order whose load is within the slack of the least
    loaded (bounded load: the least-loaded worker always qualifies)."""
    min_load = min(w.load for w in cands)
    limit = min_load + max(cfg.miss_slack, cfg.miss_slack_rel * min_load)
    return max((w for w in cands if w.load <= limit), key=lambda w: rendezvous_rank(key, w.url))


@dataclass(frozen=True)
class Choice:
    url: str
    #: why: cache_hit, named_prefix, named_prefix_holder, named_prefix_queue, balance, home, fallback,
    #: round_robin, random, power_of_two, load
    reason: str
    matched_chars: int = 0


class NoWorkerAvailable(Exception):
    """Every candidate is unhealthy or has an open circuit breaker. `retry_after_s`: when one is known to
    come back (a flap hold-down's end), whole seconds until then: the 503's Retry-After."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _available(workers: Sequence[WorkerView]) -> list[WorkerView]:
    out = [w for w in workers if w.available]
    if not out:
        raise NoWorkerAvailable("no available worker")
    return out


def overloaded(w: WorkerView, min_load: int, cfg: PolicyConfig) -> bool:
    return w.load - min_load > cfg.balance_abs and w.load > min_load * cfg.balance_rel


def power_of_two(
    cands: Sequence[WorkerView], rng: random.Random, footprint: dict[str, int] | None = None
) -> WorkerView:
    if len(cands) == 1:
        return cands[0]
    a, b = rng.sample(list(cands), 2)
    fa = footprint.get(a.url, 0) if footprint else 0
    fb = footprint.get(b.url, 0) if footprint else 0
    return a if (a.load, fa) <= (b.load, fb) else b


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
    cached: Mapping[str, int] | None = None,
    prompt_units: int = 0,
    queue_cost: float | None = None,
    footprint: Mapping[str, int] | None = None,
    key: bytes | None = None,
) -> Choice:
    """Pick the prefill (or collocated) worker. `replicas`: the warm replicas of a named prefix the
    request starts with; traffic is spread over them instead of hot-spotting the best match.

    `cached` (the KV-events path): cached prompt units per worker, exact where the worker's KV events
    are trusted (core/routing/anchors.py), else the predicted index's estimate in the same units;
    `prompt_units` the prompt's length in them. Then the holders above `cache_threshold` that are not
    overloaded are scored as Dynamo's KV router scores workers, overlap minus load: the units left to
    compute there plus `queue_cost` units per request already on the worker (what waiting behind one
    request costs, in prefill work; default: this prompt's length), lowest first. `footprint`: cached
    size per worker for the fallback's tie-break (default: the predicted index's)."""
    cands = _available(workers)
    if cfg.policy == "round_robin":
        return Choice(cands[seq % len(cands)].url, "round_robin")
    if cfg.policy == "random":
        return Choice(rng.choice(cands).url, "random")
    if cfg.policy == "power_of_two":
        return Choice(power_of_two(cands, rng).url, "power_of_two")

    min_load = min(w.load for w in cands)
    rv = key if cfg.miss_placement == "rendezvous" else None

    def tie(w: WorkerView) -> float:  # among equals: the key's rendezvous order, else random
        return -rendezvous_rank(rv, w.url) if rv is not None else rng.random()

    if cached is not None:
        matches = {w.url: cached.get(w.url, 0) for w in cands}
        text_chars = prompt_units
    else:
        matches = index.match(hashes, [w.url for w in cands], now)
    if replicas:
        named = _named_prefix(cands, matches, replicas, min_load, cfg, rng, text_chars)
        if named is not None:
            return named

    need = cfg.cache_threshold * max(text_chars, 1)
    if cached is not None:
        per_request = queue_cost if queue_cost is not None else max(text_chars, 1)
        holders = [w for w in cands if matches[w.url] > 0 and matches[w.url] >= need
                   and not overloaded(w, min_load, cfg)]
        if holders:
            best = min(holders, key=lambda w: (text_chars - matches[w.url] + per_request * w.load, tie(w)))
            return Choice(best.url, "cache_hit", matches[best.url])
    else:
        ranked = sorted(cands, key=lambda w: (-matches[w.url], w.load, tie(w) if rv is not None else 0))
        for w in ranked:
            m = matches[w.url]
            if m == 0 or m < need:
                break
            if not overloaded(w, min_load, cfg):
                return Choice(w.url, "cache_hit", m)
    size = footprint if footprint is not None else {w.url: index.footprint(w.url) for w in cands}
    loads = [w.load for w in cands]
    if max(loads) - min_load > cfg.balance_abs and max(loads) > min_load * cfg.balance_rel:
        least = [w for w in cands if w.load == min_load]
        pick = min(least, key=lambda w: (size.get(w.url, 0), rng.random()))
        return Choice(pick.url, "balance", matches[pick.url])
    if rv is not None:
        pick = home(cands, rv, cfg)
        return Choice(pick.url, "home", matches[pick.url])
    pick = power_of_two(cands, rng, dict(size))
    return Choice(pick.url, "fallback", matches[pick.url])


def _named_prefix(
    cands: Sequence[WorkerView], matches: dict[str, int], replicas: Sequence[str], min_load: int,
    cfg: PolicyConfig, rng: random.Random, text_chars: int,
) -> Choice | None:
    """Where a request that starts with a named prefix goes, or None to let the normal policy place it.

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
    uncached = max(text_chars - matches[least.url], 1)
    if excess * uncached < matches[least.url] and excess <= cfg.spill_queue_factor * cfg.balance_abs:
        return Choice(least.url, "named_prefix_queue", matches[least.url])
    return None


def _spread(ok: Sequence[WorkerView], matches: dict[str, int], rng: random.Random, reason: str) -> Choice:
    best = min(ok, key=lambda w: (w.load, rng.random()))
    deepest = max(ok, key=lambda w: matches[w.url])
    if matches[deepest.url] > matches[best.url] and deepest.load <= best.load + 1:
        best = deepest
    return Choice(best.url, reason, matches[best.url])


def choose_decode(workers: Sequence[WorkerView], rng: random.Random, *, policy: str = "load", seq: int = 0,
                  need: int | None = None, near: Collection[str] | None = None) -> Choice:
    """`need`: the KV tokens the request may grow to (prompt + max tokens): a decode whose free KV cannot
    hold it is not chosen while another can (SGLang would retract running requests there to make room, and
    each retraction costs a recompute or a host round trip); when none can, the policy chooses among all."""
    cands = _available(workers)
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
