"""The embedded router daemon and its named shared prefixes.

Every float under `router:` is finite (allow_inf_nan=False, as kv_events.replay_timeout_s): NaN fails
every comparison, so a range check alone named a bound it does not break ("Input should be greater than
0"), and a one-sided bound let inf through (a circuit breaker open for ever, health never checked)."""

from __future__ import annotations

from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import ConfigDict, Field, IPvAnyNetwork, field_validator, model_validator

from infer_ctl.profile.base import StrictModel
from infer_ctl.profile.pair_health import PairHealthSettings
from infer_ctl.profile.router_kv import KvEventsRouting
from infer_ctl.profile.tenants import Pricing, Tenant
from infer_ctl.profile.tracing import TracingSettings

#: also enforced by the admin API: names travel in URL paths (/admin/prefixes/NAME/expire)
PREFIX_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MAX_PREFIX_REPLICAS = 64
PrefixName = Annotated[str, Field(pattern=PREFIX_NAME_PATTERN)]
ListenAddress = Annotated[str, Field(pattern=r"^(\[[0-9a-fA-F:]+\]|[^:\s]+):\d{1,5}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
#: the prefill policies and the placements of a prompt no worker holds (core/routing/policy.py POLICIES and
#: policies/placement.py MISS_PLACEMENTS implement them; the layers keep core and the profile from importing
#: each other, so tests/router/test_router_settings.py checks the names agree)
PolicyName = Literal["cache_aware", "round_robin", "power_of_two", "random"]
MissPlacement = Literal["power_of_two", "rendezvous"]


def check_state_store(url: str) -> str:
    """redis://[user@]host[:port][/db] or rediss:// (TLS). A password in the URL is refused: the profile
    is not a secret store, it names the environment variable that holds it (state_store_password_env)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"{url!r} is not redis://host:port/db (or rediss:// for TLS)")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{url!r} has a bad port") from None
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host")
    if parts.password is not None:
        raise ValueError("no password in the URL: put it in an environment variable and name that variable in "
                         "router.state_store_password_env")
    db = parts.path.lstrip("/")
    if (db and not db.isdigit()) or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: the path is the database number (redis://host:{port or 6379}/0); no query")
    return url


class NamedPrefix(StrictModel):
    name: PrefixName
    #: the prefix itself, or a file holding it (relative paths resolve against the profile's directory)
    text: str | None = None
    file: str | None = None
    ttl_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    replicas: Annotated[int, Field(ge=1, le=MAX_PREFIX_REPLICAS)] = 1
    pin: bool = False
    #: text: warmed with /generate and matched against the prompt text; chat: warmed as a system
    #: message with /v1/chat/completions (the worker caches the chat-templated form)
    format: Literal["text", "chat"] = "text"
    #: with HiCache tiers: hbm (stay in HBM: warmed with the pin's priority, and again when it left HBM)
    #: or host (warm while it sits in host memory: not re-warmed because it left HBM); core/routing/prefixes.py
    keep: Literal["hbm", "host"] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.text is None) == (self.file is None):
            raise ValueError("give exactly one of text or file")
        if self.keep == "host" and self.pin:
            raise ValueError("keep: host conflicts with pin: true (pin keeps the prefix in HBM: use keep: hbm)")
        return self


class RouterTiers(StrictModel):
    """How the router weighs a prompt cached in a worker's HiCache host tier against one in HBM
    (core/routing/tiers.py, docs/router.md "KV tiers"): aware (the load-time model's weight from these
    numbers, each defaulting to Llama-3.1-70B BF16 on 8 x H100), blind (every tier as HBM), device
    (HBM only)."""

    mode: Literal["aware", "blind", "device"] = "aware"
    #: one TP rank's KV bytes per token (`inferctl plan kv`'s per-rank number)
    kv_bytes_per_token_per_rank: Annotated[int, Field(ge=1)] | None = None
    #: the prefill server's prefill rate (`inferctl plan tiers` reads it off its recompute time)
    prefill_tokens_per_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    #: host -> one GPU, effective (50 GB/s: `inferctl plan tiers --pcie-gbs`'s default)
    host_gb_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    #: the store's read bandwidth for one node (none: a storage-tier token counts 0)
    storage_gb_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None


class RouterCoalesce(StrictModel):
    """In-flight prefix coalescing (docs/router.md "In-flight prefix coalescing"): prompts in flight
    count as held by their worker for placement, and a request whose prefix a request in flight on its
    worker is computing waits for it (at most max_wait_s) instead of computing it again."""

    enabled: bool = True
    #: the shared part still being computed, in prompt tokens, worth waiting for
    min_tokens: Annotated[int, Field(ge=1)] = 256
    #: the longest a request waits for the request computing its prefix
    max_wait_s: Annotated[float, Field(gt=0, le=60, allow_inf_nan=False)] = 2.0
    #: with several router processes: coalesce across them (the flight board, router/fleet/shared_flights.py;
    #: `router serve --no-share-flights` turns it off)
    processes: bool = True


class RouterSettings(StrictModel):
    #: its floats finite (the module's docstring), as allow_inf_nan=False on the other models' fields
    model_config = ConfigDict(**StrictModel.model_config, allow_inf_nan=False)

    listen: Annotated[str, Field(pattern=r"^(\[[0-9a-fA-F:]+\]|[^:\s]+):\d{1,5}$")] = "127.0.0.1:8000"
    policy: PolicyName = "cache_aware"
    #: idle TTL of routing-index entries
    prefix_ttl_s: Annotated[float, Field(gt=0)] = 1800.0
    index_max_tokens: Annotated[int, Field(ge=1024)] = 2_000_000
    admin_token_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = "INFERCTL_ROUTER_TOKEN"
    health_interval_s: Annotated[float, Field(gt=0)] = 5.0
    #: one health check's deadline
    health_timeout_s: Annotated[float, Field(gt=0)] = 2.0
    #: consecutive failed checks that mark a worker unhealthy, and passing ones that mark it healthy again
    health_failures: Annotated[int, Field(ge=1)] = 2
    health_successes: Annotated[int, Field(ge=1)] = 1
    #: flap damping: the longest hold-down of a worker that keeps going unhealthy soon after it came
    #: back (router/control/health.py; 0: none). Capped at a day: a larger one is a typo, not a policy
    health_holddown_max_s: Annotated[float, Field(ge=0, le=86400)] = 60.0
    request_timeout_s: Annotated[float, Field(gt=0)] = 600.0
    max_concurrent: Annotated[int, Field(ge=1)] = 1024
    #: open client connections per router process; past it a new one gets 503 + Retry-After and is
    #: closed (idle slow-header connections exhausted the descriptors, and then every client was reset).
    #: None: min(the hard RLIMIT_NOFILE - 256, 50,000), read at start once the soft limit is raised
    max_connections: Annotated[int, Field(ge=1)] | None = None
    max_body_bytes: Annotated[int, Field(ge=1024)] = 32 * 1024 * 1024
    max_retries: Annotated[int, Field(ge=0, le=10)] = 2
    #: the first retry's back-off (doubled each retry, jittered)
    retry_base_s: Annotated[float, Field(ge=0)] = 0.02
    #: requests waiting for a slot beyond max_concurrent; more are answered 429
    max_queue: Annotated[int, Field(ge=0)] = 1024
    #: the longest a request waits for that slot
    queue_timeout_s: Annotated[float, Field(gt=0)] = 30.0
    #: share of the prompt a worker must hold cached to win on cache affinity
    cache_threshold: Annotated[float, Field(ge=0, le=1)] = 0.3
    #: load guard: a worker is overloaded when it has more than balance_abs requests above the least
    #: loaded worker and more than balance_rel times its load
    balance_abs: Annotated[int, Field(ge=0)] = 8
    balance_rel: Annotated[float, Field(ge=1)] = 1.5
    #: where a prompt no worker holds goes: power_of_two (the emptier, less loaded of two random workers)
    #: or rendezvous (its home by a stable hash of its first 1,024 characters, bounded load; every
    #: process and replica agrees)
    miss_placement: MissPlacement = "power_of_two"
    #: a decode whose estimated free KV cannot hold the request's prompt + max tokens is not chosen while
    #: another can (core/routing/policy.py choose_decode); off: least loaded by request count only
    decode_capacity: bool = True
    #: re-warm a named prefix on a replica that saw no traffic for this long
    rewarm_idle_s: Annotated[float, Field(gt=0)] = 300.0
    #: on shutdown, wait this long for in-flight requests
    drain_timeout_s: Annotated[float, Field(ge=0)] = 30.0
    #: mid-stream recovery: a stream whose decode fails after its first byte is continued on another pair
    #: from the prompt plus the tokens already sent (docs/router.md, "Mid-stream recovery"); off: such a
    #: stream ends with an error event
    stream_recovery: bool = True
    #: when a streamed answer's head (200, text/event-stream) goes to the client: early (as soon as the
    #: worker's stream head arrived: the client reads it while the worker computes the prefill, as it does
    #: from SGLang itself) or first_chunk (with the first token: a stream that fails before it, on every
    #: retry, is still answered with an HTTP error status). Early, such a failure ends the stream with an
    #: error event instead (docs/router.md, "When a stream's head goes out")
    stream_head: Literal["early", "first_chunk"] = "early"
    #: how a pinned named prefix is kept: touch (warmed again after pin_touch_s idle; an expired or
    #: superseded pin then ages out like any prefix) or priority (warm-ups carry a high priority for
    #: --radix-eviction-policy priority; SGLang never lowers it, so the pin outlives its TTL on the worker)
    pin_via: Literal["touch", "priority"] = "touch"
    pin_touch_s: Annotated[float, Field(gt=0)] = 5.0
    #: priority sent with pinned warm-ups under pin_via priority
    pin_priority: Annotated[int, Field(ge=0)] = 1_000_000
    #: how PD warm-ups reach a prefill: pair (a real prefill+decode pair, max_new_tokens 1; `auto` means
    #: the same) or fake_bootstrap (SGLang's 2.2.2.2 host: no decode needed, but SGLang 0.5.23 skips the
    #: radix-cache insert for it, so it warms nothing there; only for workers known to cache it)
    warm_via: Literal["auto", "pair", "fake_bootstrap"] = "auto"
    warm_fake_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    #: one structured log line per request (`router serve --log-requests`)
    log_requests: bool = False
    #: speculative acceptance (router/observe/spec_stats.py): workload labels kept per decode (more are
    #: counted as "other")
    spec_max_labels: Annotated[int, Field(ge=1)] = 16
    #: circuit breaker: consecutive failures that open it, and how long it stays open
    cb_failures: Annotated[int, Field(ge=1)] = 5
    cb_open_s: Annotated[float, Field(gt=0)] = 10.0
    #: successful probes of a half-open breaker that close it
    cb_successes: Annotated[int, Field(ge=1)] = 2
    prefixes: list[NamedPrefix] = Field(default_factory=list)
    #: tenants with their keys and limits (profile/tenants.py); none: no tenant logic on the request path
    tenants: list[Tenant] = Field(default_factory=list)
    #: names the tenant when no tenant has a key (lower-case HTTP header name)
    tenant_header: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")] = "x-inferctl-tenant"
    #: header mode: the proxies (CIDRs) whose connections may name a tenant by that header; others that
    #: send it get 403. Empty: ANY client may claim ANY tenant (docs/observability.md). Beside
    #: tenant_header, not under `tenants` (a list of tenants)
    tenant_trusted_proxies: list[IPvAnyNetwork] = Field(default_factory=list)
    #: what the workers cost: live cost per tenant (inferctl_tenant_cost_dollars_total)
    pricing: Pricing | None = None
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    #: avoid prefill x decode pairs whose pair test failed or whose KV transfers degrade
    pair_health: PairHealthSettings = Field(default_factory=PairHealthSettings)
    #: the exact index from the workers' KV events (profile/router_kv.py)
    kv_events: KvEventsRouting = Field(default_factory=KvEventsRouting)
    #: the listen addresses of every `router serve` replica in front of this fleet; more than one needs
    #: state_store (docs/router.md, "Several replicas")
    replicas: list[ListenAddress] = Field(default_factory=list)
    #: where the replicas share named prefixes and worker changes: redis://[user@]host:port/db, rediss:// for TLS
    state_store: str | None = None
    #: the environment variable holding the store's password (never the profile itself)
    state_store_password_env: EnvName | None = None
    tiers: RouterTiers = Field(default_factory=RouterTiers)
    coalesce: RouterCoalesce = Field(default_factory=RouterCoalesce)

    @field_validator("listen")
    @classmethod
    def _port_in_range(cls, v: str) -> str:
        if int(v.rsplit(":", 1)[1]) > 65535:
            raise ValueError(f"port of {v!r} is above 65535")
        return v

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        for addr in v:
            if int(addr.rsplit(":", 1)[1]) > 65535:
                raise ValueError(f"port of {addr!r} is above 65535")
            if addr in seen:
                raise ValueError(f"{addr!r} is listed twice")
            seen.add(addr)
        return v

    @field_validator("state_store")
    @classmethod
    def _state_store(cls, v: str | None) -> str | None:
        return None if v is None else check_state_store(v)

    @model_validator(mode="after")
    def _store_for_replicas(self) -> Self:
        if len(self.replicas) > 1 and self.state_store is None:
            raise ValueError(f"router.replicas lists {len(self.replicas)} replicas: router.state_store is required "
                             "(redis://host:port/db), where they share named prefixes and worker changes")
        return self

    @property
    def listen_host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])
