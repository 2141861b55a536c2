"""Runtime state of each worker: in-flight count, health, circuit breaker, reported load, identity."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from infer_ctl.core.routing.breaker import CircuitBreaker
from infer_ctl.core.routing.flap import FlapDamper
from infer_ctl.core.routing.policy import WorkerView
from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig, WorkerSpec, circuit_breaker

if TYPE_CHECKING:
    from infer_ctl.router.fleet.shared_load import SharedLoad


@dataclass
class WorkerState:
    spec: WorkerSpec
    breaker: CircuitBreaker
    #: this process's requests in flight on the worker (`inflight`); with several router processes,
    #: also stored in this process's cell of the shared load block (router/fleet/shared_load.py)
    own_inflight: int = 0
    healthy: bool = True
    health_failures: int = 0
    health_successes: int = 0
    #: flap damping (core/routing/flap.py): a worker that goes unhealthy again soon after it came back
    #: is let back after a hold-down that doubles with each such flap (router/control/health.py)
    flap: FlapDamper = field(default_factory=FlapDamper)
    #: worker-reported load (/v1/loads): waiting and running requests, KV capacity in tokens
    queued: int = 0
    running: int = 0
    #: requests on the worker that are not this router's (other clients), as of the last load poll:
    #: reported waiting + running minus our in-flight then. The policy adds this to our live in-flight
    #: count; adding the raw waiting queue would count our own queued requests twice.
    external: int = 0
    #: prefill only: the bootstrap port the worker reports in /server_info (disaggregation_bootstrap_port)
    bootstrap_reported: int | None = None
    max_total_tokens: int | None = None
    #: a decode's KV pool and what it reported in use at the last poll (/v1/loads max_total_num_tokens,
    #: num_used_tokens); `need_ema`: the KV tokens the requests routed to it may grow to, on average
    kv_total: int | None = None
    kv_used: int = 0
    need_ema: float | None = None
    #: router clock of the last /v1/loads answer: how fresh `queued`/`running` are (pd control refuses to
    #: switch on a stale view, core/pd/control.py)
    polled_at: float | None = None
    #: identity of the worker process (/server_info start time); a change means a restart
    instance: str | None = None
    #: the worker evicts by priority (--radix-eviction-policy priority): pinned warm-ups get priority
    radix_priority: bool = False
    last_error: str | None = None
    requests: int = 0
    errors: int = 0
    restarts: int = 0
    removed: bool = False
    #: taken out of new routing decisions while its in-flight requests finish (POST /admin/workers/drain)
    draining: bool = False

    #: with several router processes: the shared block and this worker's slot and cell in it
    shared: SharedLoad | None = None
    slot: int | None = None
    cell: int = 0

    @property
    def inflight(self) -> int:
        """This process's in-flight requests (what `+= 1` / `-= 1` around an upstream call count)."""
        return self.own_inflight

    @inflight.setter
    def inflight(self, value: int) -> None:
        self.own_inflight = value
        if self.shared is not None:
            self.shared.cells[self.cell] = value  # one aligned 8-byte store into this process's row

    @property
    def load_inflight(self) -> int:
        """In flight over every router process: what the policy, drains and /v1/loads accounting use."""
        shared = self.shared
        if shared is None:
            return self.own_inflight
        return sum(shared.cells[self.slot:shared.extra_offset:shared.stride])  # the load rows only

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def role(self) -> str:
        return self.spec.role

    def available(self, now: float) -> bool:
        return self.healthy and not self.removed and not self.draining and self.breaker.allows(now)

    def view(self, now: float) -> WorkerView:
        return WorkerView(self.spec.url, self.load_inflight, self.external, self.available(now), self.kv_free())

    def kv_free(self) -> int | None:
        """A decode's free KV as the router estimates it: the pool less the larger of what the worker held at
        its last poll and what this router's requests on it may grow to (in flight x their average need).
        The poll alone is seconds old and counts what running requests hold, not what they will grow to."""
        if self.kv_total is None or self.role != "decode":
            return None
        committed = self.load_inflight * self.need_ema if self.need_ema is not None else 0.0
        return max(0, int(self.kv_total - max(float(self.kv_used), committed)))

    def routed(self, need: int) -> None:
        """A request that may grow to `need` KV tokens was sent here (the average over about 20 requests)."""
        self.need_ema = float(need) if self.need_ema is None else self.need_ema + (need - self.need_ema) / 20

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            **self.spec.as_dict(),
            "healthy": self.healthy,
            "available": self.available(now),
            "circuit_breaker": self.breaker.state.value,
            "inflight": self.load_inflight,
            "queued": self.queued,
            "external": self.external,
            "running": self.running,
            "max_total_tokens": self.max_total_tokens,
            "radix_eviction_priority": self.radix_priority,
            "requests": self.requests,
            "errors": self.errors,
            "restarts": self.restarts,
            "draining": self.draining,
            "last_error": self.last_error,
            **self.flap_doc(now),
        }

    def flap_doc(self, now: float) -> dict[str, Any]:
        """Flap damping: ejections so far, flaps in a row, the hold-down in force and what is left of it,
        and `held` while the worker answers its checks but its hold-down keeps it out."""
        f = self.flap
        left = 0.0 if self.healthy else f.left_s(now)  # readmitted: its hold-down is 0 anyway
        return {"ejections": f.ejections, "flaps": f.flaps, "holddown_s": f.holddown_s,
                "holddown_left_s": round(left, 3), "held": left > 0 and f.answering_since is not None}


class WorkerRegistry:
    def __init__(self, cfg: RouterConfig, shared: SharedLoad | None = None, process: int = 0) -> None:
        """With several router processes, in-flight requests are counted in `shared` (row `process`): the
        configured workers take slots 0..n-1 in their configured order, which every process computes the
        same way."""
        self.cfg = cfg
        self.by_url: dict[str, WorkerState] = {}
        #: several router processes: the shared load block, this process's row, the next free slot
        self.shared = shared
        self.process = process
        self.next_slot = 0
        for spec in cfg.workers:
            self.add(spec)

    def _place(self, w: WorkerState, slot: int) -> None:
        assert self.shared is not None
        if slot >= self.shared.slots:
            raise UsageError(f"no free worker slot: the router's processes share {self.shared.slots} worker slots "
                             "and every one was used since the router started",
                             remedy="restart the router (slots of removed workers are not reused while it runs)")
        w.shared, w.slot, w.cell = self.shared, slot, self.shared.cell(self.process, slot)
        w.inflight = w.own_inflight
        self.next_slot = max(self.next_slot, slot + 1)

    def add(self, spec: WorkerSpec, slot: int | None = None) -> WorkerState:
        """Register a worker; with a shared load block it takes `slot` (a follower: the leader's
        choice) or the next free one (the leader). Raises ValueError (a duplicate) or UsageError
        (no free slot)."""
        if spec.url in self.by_url:
            raise ValueError(f"worker {spec.url} is already registered")
        breaker = circuit_breaker(self.cfg.settings)
        state = WorkerState(spec=spec, breaker=breaker)
        if self.shared is not None:
            self._place(state, self.next_slot if slot is None else slot)
        self.by_url[spec.url] = state
        return state

    def url_of_slot(self, slot: int) -> str | None:
        """The worker in shared `slot` (a flight on the board names its worker so), None when this
        process does not know it (added at runtime and not yet learned, or removed)."""
        return next((w.url for w in self.by_url.values() if w.slot == slot), None)

    def slot_of(self, url: str) -> int | None:
        w = self.by_url.get(url)
        return None if w is None else w.slot

    def remove(self, url: str) -> WorkerState:
        state = self.by_url.pop(url)
        state.removed = True
        return state

    def role(self, *roles: str) -> list[WorkerState]:
        return [w for w in self.by_url.values() if w.spec.role in roles]

    def prefill_like(self) -> list[WorkerState]:
        """Workers that compute prompts: prefill in PD mode, every worker in collocated mode."""
        return self.role("prefill", "mixed")

    def near(self, url: str) -> set[str]:
        """The decodes in the NVLink domain of worker `url`'s host (RouterConfig.nvlink_domains); empty when
        its host has none."""
        domains = self.cfg.nvlink_domains
        dom = domains.get(urlsplit(url).hostname or "") if domains else None
        if dom is None:
            return set()
        return {w.url for w in self.by_url.values() if w.spec.role == "decode"
                and domains.get(urlsplit(w.url).hostname or "") == dom}

    def all(self) -> list[WorkerState]:
        return list(self.by_url.values())
