"""What every prefill policy sees and returns, and the interface they share."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.units import ScoreInputs


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


@dataclass(frozen=True)
class Choice:
    url: str
    #: why: cache_hit, named_prefix, named_prefix_holder, named_prefix_queue, balance, home, fallback,
    #: round_robin, random, power_of_two, load
    reason: str
    #: the prompt the chosen worker holds: characters on the predicted path, tokens with ScoreInputs
    matched_chars: int = 0


class NoWorkerAvailable(Exception):
    """Every candidate is unhealthy or has an open circuit breaker. `retry_after_s`: when one is known to
    come back (a flap hold-down's end), whole seconds until then: the 503's Retry-After."""

    def __init__(self, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def available(workers: Sequence[WorkerView]) -> list[WorkerView]:
    out = [w for w in workers if w.available]
    if not out:
        raise NoWorkerAvailable("no available worker")
    return out


def overloaded(w: WorkerView, min_load: int, cfg: PolicyConfig) -> bool:
    """The load guard (as sglang-router's): more than `balance_abs` above the least-loaded worker *and* more
    than `balance_rel` times it."""
    return w.load - min_load > cfg.balance_abs and w.load > min_load * cfg.balance_rel


class PrefillRequest(NamedTuple):
    """One prefill decision's inputs: the available candidates (never empty) and what the request brings.
    Immutable like the snapshots it carries; a NamedTuple because it is built once per routing decision (a
    frozen dataclass of these twelve fields took 2.5 us to build, this well under 1)."""

    cands: Sequence[WorkerView]
    cfg: PolicyConfig
    rng: random.Random
    #: decision counter: round-robin position
    seq: int = 0
    hashes: Sequence[int] = ()
    text_chars: int = 0
    prefix_index: PrefixIndex | None = None
    now: float = 0.0
    #: warm replicas of a named prefix the request starts with (named_prefix.py)
    replicas: Sequence[str] | None = None
    #: the KV-events path's inputs in named units (core/routing/units.py); None: the predicted index alone
    tokens: ScoreInputs | None = None
    #: cached characters per worker for the fallback's tie-break; None: ScoreInputs' or the index's
    footprint: Mapping[str, int] | None = None
    #: the prompt's placement key (placement.py), with miss_placement "rendezvous"
    key: bytes | None = None


class PrefillPolicy(Protocol):
    """A prefill policy: chooses one of `req.cands` (pure; randomness only from `req.rng`)."""

    def choose(self, req: PrefillRequest) -> Choice: ...
