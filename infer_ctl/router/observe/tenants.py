"""Tenants at the router: who sent a request (API key, or a header when no keys are configured), whether
its limits admit it, and what it used - tokens as the workers reported them, and its share of the
workers' cost.

Identification: the bearer token's SHA-256 is compared with every configured tenant's in constant time
(hmac.compare_digest, no early exit), so neither the answer nor its timing says which tenants exist; an
unknown or missing key is a 401 that names none. Limits, checked before the router's own admission
(core/tenancy/buckets.py): max concurrency, tokens per minute, requests per second (one token per
admitted request). A refusal is a 429 with Retry-After and a JSON error naming the limit.

Tokens per minute: an admitted request reserves its estimate at once (`reserve`, core/tenancy/
estimate.py: prompt + max tokens), in the same step as the admission check, so the next request sees
it; a bucket at or below zero refuses. When the request ends it is settled (`settle`) with the tokens
its answer reported: the excess is charged, the rest given back. One that reached a worker and ended
without a report (failed, cancelled, a broken stream) keeps its reservation (the worker computed
something, and a tenant must not get tokens for free by cancelling), or its prompt estimate plus the
completion the relay counted as it streamed when that is more (observe.py `streamed_tokens`); one that
never reached a worker gets it all back. The overshoot is bounded by one request's reservation, plus what the estimates
undercount (a chat request without max tokens reserves its prompt only).

Cost: each worker's price per second (core/tenancy/pricing.py, from the profile's lease pricing) is
split between the requests in flight on it by the share clock (core/tenancy/shares.py); a request's
prefill and decode calls add their share to its tenant's `inferctl_tenant_cost_dollars_total`, and the
time nobody was in flight adds to `inferctl_router_idle_cost_dollars_total`.

Metrics per tenant are plain numbers read at scrape time (the request path adds to ints, no lock), the
TTFT histogram excepted. Their label values are the configured tenant names, so the cardinality is
bounded by the profile (at most MAX_TENANTS); with pricing and no tenants every request is `none`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infer_ctl.core.tenancy.buckets import TokenBucket, retry_after_s
from infer_ctl.core.tenancy.pricing import RolePrice, worker_usd_per_s
from infer_ctl.core.tenancy.shares import ShareClock
from infer_ctl.errors import UsageError
from infer_ctl.profile.tenants import MIN_KEY_CHARS
from infer_ctl.router.http.jsonio import dumps, openai_error_type
from infer_ctl.router.observe.trusted import parse_networks, trusted

if TYPE_CHECKING:
    from infer_ctl.profile import Profile

log = logging.getLogger("infer_ctl.router")
#: the tenant of every request when pricing is configured without tenants
NO_TENANT = "none"
LIMITS = ("auth", "max_concurrency", "tokens_per_min", "requests_per_s")
_TTFT = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class TenantSpec:
    name: str
    #: SHA-256 of the API key (None: named by the tenant header)
    digest: bytes | None = None
    requests_per_s: float | None = None
    burst: int | None = None
    tokens_per_min: int | None = None
    max_concurrency: int | None = None
    #: named prefixes whose warm replicas the tenant may use (None: all)
    prefixes: frozenset[str] | None = None
    priority: int | None = None


def price_role(worker_role: str) -> str:
    """The router.pricing role of a worker: collocated workers are `mixed` in the router."""
    return "collocated" if worker_role == "mixed" else worker_role


def key_digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _read_key(name: str, source: str, value: str | None) -> str:
    key = (value or "").strip()
    if not key:
        raise UsageError(f"router.tenants {name}: {source} is empty or missing",
                         remedy="put the tenant's API key there (`inferctl router tenant-key` makes one)")
    if len(key) < MIN_KEY_CHARS:
        raise UsageError(f"router.tenants {name}: the key in {source} has {len(key)} characters, fewer than "
                         f"{MIN_KEY_CHARS}", remedy="use a random key (`inferctl router tenant-key` makes one)")
    return key


def specs_from_profile(profile: Profile, env: Mapping[str, str]) -> list[TenantSpec]:
    """The profile's tenants with their keys hashed; keys named by key_env / key_file are read now (once)."""
    out = []
    for t in profile.router.tenants:
        digest: bytes | None = None
        if t.key_sha256:
            digest = bytes.fromhex(t.key_sha256)
        elif t.key_env:
            digest = key_digest(_read_key(t.name, f"${t.key_env}", env.get(t.key_env)))
        elif t.key_file:
            path = Path(os.path.expanduser(t.key_file))
            path = path if path.is_absolute() else profile.base_dir / path
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"router.tenants {t.name}: cannot read key_file {path}: {exc}",
                                 remedy="fix router.tenants[].key_file") from None
            digest = key_digest(_read_key(t.name, str(path), text))
        out.append(TenantSpec(t.name, digest, t.requests_per_s, t.burst, t.tokens_per_min, t.max_concurrency,
                              None if t.prefixes is None else frozenset(t.prefixes), t.priority))
    return out


def prices_from_profile(profile: Profile) -> dict[str, float]:
    """router.pricing as dollars per second per worker, by role (prefill, decode, collocated): GPUs per
    node and node count from the profile's nodes of that role (8 GPUs and 1 node when it has none), tp
    from the target model."""
    pricing = profile.router.pricing
    if pricing is None:
        return {}
    tp = profile.models.target.tp if profile.models else None
    out: dict[str, float] = {}
    for role in ("prefill", "decode", "collocated"):
        rp = getattr(pricing, role)
        if rp is None:
            continue
        nodes = [n for n in profile.nodes if (profile.collocated if role == "collocated" else
                                              not profile.collocated and n.has_role(role))]
        gpus = rp.gpus_per_node or (nodes[0].gpus if nodes and nodes[0].gpus else 8)
        price = RolePrice(role, gpus, nodes=len(nodes) or 1, tp=tp, node_hour_usd=rp.node_hour_usd,
                          gpu_hour_usd=rp.gpu_hour_usd)
        out[role] = worker_usd_per_s(price)
    return out


@dataclass
class TenantState:
    spec: TenantSpec
    rps: TokenBucket | None
    tpm: TokenBucket | None
    ttft: Any  # the tenant's child of inferctl_tenant_ttft_seconds
    inflight: int = 0
    requests: int = 0
    errors: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    #: tokens reserved by the tenant's requests in flight (tokens_per_min)
    reserved: int = 0
    cost: dict[str, float] = field(default_factory=dict)  # role -> dollars
    rejected: dict[str, int] = field(default_factory=dict)  # limit -> count

    @property
    def name(self) -> str:
        return self.spec.name

    def as_dict(self, now: float) -> dict[str, Any]:
        s = self.spec
        return {
            "tenant": s.name, "keyed": s.digest is not None, "priority": s.priority,
            "limits": {"requests_per_s": s.requests_per_s, "burst": s.burst, "tokens_per_min": s.tokens_per_min,
                       "max_concurrency": s.max_concurrency,
                       "prefixes": None if s.prefixes is None else sorted(s.prefixes)},
            "buckets": {"requests": None if self.rps is None else round(self.rps.refill(now), 3),
                        "tokens": None if self.tpm is None else round(self.tpm.refill(now), 1),
                        "reserved_tokens": None if self.tpm is None else self.reserved},
            "inflight": self.inflight, "requests": self.requests, "errors": self.errors,
            "input_tokens": self.input_tokens, "cached_tokens": self.cached_tokens,
            "output_tokens": self.output_tokens, "cost_usd": {k: round(v, 9) for k, v in sorted(self.cost.items())},
            "rejected": dict(sorted(self.rejected.items())),
        }


@dataclass(frozen=True)
class TenantRefusal:
    status: int
    limit: str
    message: str
    retry_after: int | None = None

    def body(self) -> bytes:
        err: dict[str, Any] = {"message": self.message, "type": openai_error_type(self.status),
                               "code": self.status, "limit": self.limit}
        if self.retry_after is not None:
            err["retry_after_s"] = self.retry_after
        return dumps({"error": err})

    def headers(self) -> dict[str, str]:
        if self.status == 401:
            return {"WWW-Authenticate": "Bearer"}
        return {} if self.retry_after is None else {"Retry-After": str(self.retry_after)}


UNKNOWN_KEY = TenantRefusal(401, "auth", "missing or unknown API key; send Authorization: Bearer <key>")
UNKNOWN_TENANT = TenantRefusal(401, "auth", "missing or unknown tenant")


class Tenancy:
    def __init__(self, specs: list[TenantSpec], *, header: str, worker_usd_per_s: Mapping[str, float],
                 clock: Callable[[], float], registry: CollectorRegistry,
                 worker_roles: Callable[[], Mapping[str, str]] = dict, trusted_proxies: Sequence[str] = ()) -> None:
        """`trusted_proxies`: in header mode, the CIDRs whose connections may name a tenant (observe/trusted.py);
        empty: every client may."""
        self.clock = clock
        self.trusted = parse_networks(trusted_proxies)
        #: worker url -> role, read at scrape time (the idle cost per role)
        self.worker_roles = worker_roles
        self.header = header
        self.ttft = Histogram("inferctl_tenant_ttft_seconds", "Router-measured time to first streamed chunk, per tenant",
                              ["tenant"], buckets=_TTFT, registry=registry)
        now = clock()
        self.tenants: dict[str, TenantState] = {}
        for spec in specs or [TenantSpec(NO_TENANT)]:
            rps = (TokenBucket(spec.requests_per_s, spec.burst or max(1.0, spec.requests_per_s), now)
                   if spec.requests_per_s else None)
            tpm = TokenBucket(spec.tokens_per_min / 60.0, float(spec.tokens_per_min), now) if spec.tokens_per_min else None
            self.tenants[spec.name] = TenantState(spec, rps, tpm, self.ttft.labels(spec.name))
        #: no tenants configured (pricing only): every request is the one NO_TENANT
        self.anonymous = not specs
        self._keyed = [t for t in self.tenants.values() if t.spec.digest is not None]
        if specs and not self._keyed and not self.trusted:
            log.warning("tenants are named by the %s header and router.tenant_trusted_proxies is empty: any client "
                        "can claim any tenant (its limits and its bill); set it to your front proxies' CIDRs",
                        header)
        self._default = self.tenants.get("default")
        self.worker_usd_per_s = dict(worker_usd_per_s)
        self.clocks: dict[str, ShareClock] = {}
        #: refusals before a tenant was known (401s)
        self.unknown_rejected = 0
        registry.register(_TenantCollector(self))

    # ---- admission -----------------------------------------------------------------------------
    def header_refusal(self, headers: Mapping[str, str], repeated: Collection[str], peer: str | None) -> TenantRefusal | None:
        """Header mode: a tenant header sent twice is ambiguous (400: a front proxy that adds the header
        would otherwise be overridden by a client's own copy, whichever came last), and one from a
        connection outside trusted_proxies is refused (403)."""
        if self.header in repeated:
            return TenantRefusal(400, "auth", f"the {self.header} header is sent more than once: ambiguous; send it once")
        if self.trusted and self.header in headers and not trusted(self.trusted, peer):
            return TenantRefusal(403, "auth", f"{self.header} is only accepted from the router's trusted proxies "
                                              "(router.tenant_trusted_proxies); send the request through one")
        return None

    def identify(self, headers: Mapping[str, str]) -> TenantState | None:
        if self.anonymous:
            return self.tenants[NO_TENANT]
        if not self._keyed:
            name = headers.get(self.header)
            return self.tenants.get(name, self._default) if name else self._default
        scheme, _, cred = headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not cred.strip():
            return None
        digest = key_digest(cred.strip())
        found = None
        for t in self._keyed:  # every comparison runs: the time does not depend on which one matched
            if hmac.compare_digest(t.spec.digest, digest):  # type: ignore[arg-type]  # keyed: digest is set
                found = t
        return found

    def admit(self, headers: Mapping[str, str], repeated: Collection[str] = (),
              peer: str | None = None) -> tuple[TenantState | None, TenantRefusal | None]:
        """The request's tenant, or why it is refused. An admitted request calls `leave` exactly once.
        `repeated`: the header names the request carries more than once; `peer`: its client's address."""
        if not self.anonymous and not self._keyed and (refused := self.header_refusal(headers, repeated, peer)):
            self.unknown_rejected += 1
            return None, refused
        tenant = self.identify(headers)
        if tenant is None:
            self.unknown_rejected += 1
            return None, UNKNOWN_KEY if self._keyed else UNKNOWN_TENANT
        spec, now = tenant.spec, self.clock()
        refusal = None
        if spec.max_concurrency is not None and tenant.inflight >= spec.max_concurrency:
            refusal = TenantRefusal(429, "max_concurrency", f"over the tenant's max_concurrency of {spec.max_concurrency} "
                                    "requests in flight; retry later", 1)
        elif tenant.tpm is not None and not tenant.tpm.allows(now):
            refusal = TenantRefusal(429, "tokens_per_min", f"over the tenant's tokens_per_min of {spec.tokens_per_min}; "
                                    "retry later", retry_after_s(tenant.tpm.wait_s(now)))
        elif tenant.rps is not None and not tenant.rps.take(now):
            refusal = TenantRefusal(429, "requests_per_s", f"over the tenant's requests_per_s of {spec.requests_per_s:g}; "
                                    "retry later", retry_after_s(tenant.rps.wait_s(now, 1.0)))
        if refusal is not None:
            tenant.rejected[refusal.limit] = tenant.rejected.get(refusal.limit, 0) + 1
            return tenant, refusal
        tenant.inflight += 1
        tenant.requests += 1
        return tenant, None

    def leave(self, tenant: TenantState, status: int) -> None:
        tenant.inflight -= 1
        if status >= 500 or status == 499:
            tenant.errors += 1

    def reserve(self, tenant: TenantState, units: int) -> int:
        """Charge an admitted request's estimate to the tenant's token bucket now; what was reserved."""
        if tenant.tpm is None or units <= 0:
            return 0
        tenant.tpm.charge(self.clock(), units)
        tenant.reserved += units
        return units

    def settle(self, tenant: TenantState, reserved: int, used: int) -> None:
        """A request that reserved `reserved` ended having used `used` tokens: charge or give back the
        difference."""
        if tenant.tpm is None:
            return
        tenant.reserved -= reserved
        now = self.clock()
        if used > reserved:
            tenant.tpm.charge(now, used - reserved)
        elif used < reserved:
            tenant.tpm.credit(now, reserved - used)

    # ---- usage ---------------------------------------------------------------------------------
    def used(self, tenant: TenantState, prompt: int, cached: int, completion: int) -> None:
        """What an answer reported (the bucket is settled when the request ends: `settle`)."""
        tenant.input_tokens += prompt
        tenant.cached_tokens += cached
        tenant.output_tokens += completion

    def enter(self, url: str) -> float:
        c = self.clocks.get(url)
        if c is None:
            c = self.clocks[url] = ShareClock(self.clock())
        return c.enter(self.clock())

    def leave_worker(self, tenant: TenantState, url: str, role: str, mark: float) -> None:
        share = self.clocks[url].leave(self.clock(), mark)
        role = price_role(role)
        price = self.worker_usd_per_s.get(role)
        if price:
            tenant.cost[role] = tenant.cost.get(role, 0.0) + share * price

    def idle_usd(self) -> dict[str, float]:
        """Per role: the cost of the time no request of this router was in flight on its workers (since
        each worker's first request)."""
        now = self.clock()
        roles = self.worker_roles()
        out: dict[str, float] = {}
        for url, c in self.clocks.items():
            role = price_role(roles.get(url, ""))
            price = self.worker_usd_per_s.get(role)
            if not price:
                continue
            c.advance(now)
            out[role] = out.get(role, 0.0) + c.idle_s * price
        return out

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        return {"mode": "none" if self.anonymous else "key" if self._keyed else "header",
                "header": None if self._keyed or self.anonymous else self.header,
                "worker_usd_per_hour": {k: round(v * 3600, 6) for k, v in sorted(self.worker_usd_per_s.items())},
                "unknown_rejected": self.unknown_rejected,
                "tenants": [t.as_dict(now) for t in self.tenants.values()]}


class _TenantCollector(Collector):
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        t = self.tenancy
        lab = ["tenant"]
        reqs = CounterMetricFamily("inferctl_tenant_requests", "Requests admitted, per tenant", labels=lab)
        errs = CounterMetricFamily("inferctl_tenant_errors", "Admitted requests that failed (5xx, or the client "
                                   "went away), per tenant", labels=lab)
        inp = CounterMetricFamily("inferctl_tenant_input_tokens", "Prompt tokens the workers reported, per tenant",
                                  labels=lab)
        cached = CounterMetricFamily("inferctl_tenant_cached_tokens", "Cached prompt tokens the workers reported, "
                                     "per tenant", labels=lab)
        out = CounterMetricFamily("inferctl_tenant_output_tokens", "Completion tokens the workers reported, per tenant",
                                  labels=lab)
        cost = CounterMetricFamily("inferctl_tenant_cost_dollars", "The tenant's share of the workers' lease, by "
                                   "role (router.pricing)", labels=["tenant", "role"])
        rej = CounterMetricFamily("inferctl_tenant_rejected", "Requests refused by a tenant limit (auth: unknown key "
                                  "or tenant, tenant label 'unknown')", labels=["tenant", "limit"])
        infl = GaugeMetricFamily("inferctl_tenant_inflight", "Requests in flight, per tenant", labels=lab)
        for s in t.tenants.values():
            k = [s.name]
            reqs.add_metric(k, s.requests)
            errs.add_metric(k, s.errors)
            inp.add_metric(k, s.input_tokens)
            cached.add_metric(k, s.cached_tokens)
            out.add_metric(k, s.output_tokens)
            infl.add_metric(k, s.inflight)
            for role, usd in s.cost.items():
                cost.add_metric([s.name, role], usd)
            for limit, n in s.rejected.items():
                rej.add_metric([s.name, limit], n)
        if t.unknown_rejected:
            rej.add_metric(["unknown", "auth"], t.unknown_rejected)
        idle = CounterMetricFamily("inferctl_router_idle_cost_dollars", "Lease of the workers' time with no request "
                                   "of this router in flight, by role (router.pricing)", labels=["role"])
        for role, usd in t.idle_usd().items():
            idle.add_metric([role], usd)
        yield from (reqs, errs, inp, cached, out, cost, rej, infl, idle)
