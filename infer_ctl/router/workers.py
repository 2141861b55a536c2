"""Runtime state of each worker: in-flight count, health, circuit breaker, reported load, identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infer_ctl.core.routing.breaker import CircuitBreaker
from infer_ctl.core.routing.policy import WorkerView
from infer_ctl.router.config import RouterConfig, WorkerSpec


@dataclass
class WorkerState:
    spec: WorkerSpec
    breaker: CircuitBreaker
    inflight: int = 0
    healthy: bool = True
    health_failures: int = 0
    health_successes: int = 0
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

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def role(self) -> str:
        return self.spec.role

    def available(self, now: float) -> bool:
        return self.healthy and not self.removed and not self.draining and self.breaker.allows(now)

    def view(self, now: float) -> WorkerView:
        return WorkerView(self.spec.url, self.inflight, self.external, self.available(now))

    def as_dict(self, now: float) -> dict[str, Any]:
        return {
            **self.spec.as_dict(),
            "healthy": self.healthy,
            "available": self.available(now),
            "circuit_breaker": self.breaker.state.value,
            "inflight": self.inflight,
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
        }


class WorkerRegistry:
    def __init__(self, cfg: RouterConfig) -> None:
        self.cfg = cfg
        self.by_url: dict[str, WorkerState] = {}
        for spec in cfg.workers:
            self.add(spec)

    def add(self, spec: WorkerSpec) -> WorkerState:
        if spec.url in self.by_url:
            raise ValueError(f"worker {spec.url} is already registered")
        breaker = CircuitBreaker(failure_threshold=self.cfg.cb_failures, success_threshold=self.cfg.cb_successes,
                                 open_s=self.cfg.cb_open_s)
        state = self.by_url[spec.url] = WorkerState(spec=spec, breaker=breaker)
        return state

    def remove(self, url: str) -> WorkerState:
        state = self.by_url.pop(url)
        state.removed = True
        return state

    def role(self, *roles: str) -> list[WorkerState]:
        return [w for w in self.by_url.values() if w.spec.role in roles]

    def prefill_like(self) -> list[WorkerState]:
        """Workers that compute prompts: prefill in PD mode, every worker in collocated mode."""
        return self.role("prefill", "mixed")

    def all(self) -> list[WorkerState]:
        return list(self.by_url.values())
