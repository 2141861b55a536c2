"""Everything the daemon needs to run, resolved from a profile plus command-line/programmatic overrides."""

from __future__ import annotations

import ipaddress
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from infer_ctl.core.routing.coalesce import CoalesceConfig
from infer_ctl.core.routing.policy import MISS_PLACEMENTS
from infer_ctl.core.routing.tiers import (
    BLIND,
    DEFAULT_HOST_GB_S,
    DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK,
    DEFAULT_PREFILL_TOKENS_PER_S,
    TierWeights,
    weights_from,
)
from infer_ctl.errors import UsageError
from infer_ctl.router.kvindex.kv_settings import apply_profile as apply_kv_profile
from infer_ctl.router.observe.tenants import TenantSpec, prices_from_profile, specs_from_profile
from infer_ctl.router.observe.tracing import TracingConfig, config_from

if TYPE_CHECKING:
    from infer_ctl.profile import Profile

Role = Literal["prefill", "decode", "mixed"]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class WorkerSpec:
    url: str
    role: Role
    #: prefill only: the bootstrap server port (None: the decode uses its own default)
    bootstrap_port: int | None = None

    def as_dict(self) -> dict[str, object]:
        return {"url": self.url, "role": self.role, "bootstrap_port": self.bootstrap_port}


@dataclass(frozen=True)
class PrefixSpec:
    name: str
    text: str
    ttl_s: float | None = None
    replicas: int = 1
    pin: bool = False
    fmt: str = "text"
    keep: str | None = None


@dataclass
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    workers: list[WorkerSpec] = field(default_factory=list)
    policy: str = "cache_aware"
    cache_threshold: float = 0.3
    balance_abs: int = 8
    balance_rel: float = 1.5
    #: where a prompt no worker holds goes (core/routing/policy.py): power_of_two (the emptier, less
    #: loaded of two random workers) or rendezvous (its home by a stable hash of its first characters,
    #: the same in every process and replica)
    miss_placement: str = "power_of_two"
    prefix_ttl_s: float = 1800.0
    index_max_tokens: int = 2_000_000
    block_chars: int = 64
    #: a decode whose estimated free KV cannot hold the request's prompt + max tokens is not chosen while
    #: another can (core/routing/policy.py choose_decode); False: least loaded by request count only
    decode_capacity: bool = True
    #: worker host -> its NVLink domain (the profile's nodes[].nvlink_domain): a decode in the prefill's domain
    #: is preferred when it is about as loaded as the least loaded one
    nvlink_domains: dict[str, str] = field(default_factory=dict)
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    health_failures: int = 2
    health_successes: int = 1
    #: flap damping (router/control/health.py): the longest hold-down of a worker that keeps going unhealthy
    #: soon after it came back (0: none, every worker let back on its first passing checks)
    health_holddown_max_s: float = 60.0
    cb_failures: int = 5
    cb_open_s: float = 10.0
    cb_successes: int = 2
    request_timeout_s: float = 600.0
    max_concurrent: int = 1024
    #: open client connections per process (None: from RLIMIT_NOFILE at start, daemon/nofile.py)
    max_connections: int | None = None
    max_queue: int = 1024
    queue_timeout_s: float = 30.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_retries: int = 2
    retry_base_s: float = 0.02
    drain_timeout_s: float = 30.0
    #: continue a stream whose decode failed after the first byte on another pair (request/recovery.py)
    stream_recovery: bool = True
    admin_token: str | None = None
    admin_token_env: str = "INFERCTL_ROUTER_TOKEN"
    prefixes: list[PrefixSpec] = field(default_factory=list)
    rewarm_idle_s: float = 300.0
    #: how PD warm-ups reach a prefill: pair (a real prefill+decode pair, max_new_tokens 1; `auto` means
    #: the same) or fake_bootstrap (SGLang's 2.2.2.2 host: no decode needed, but SGLang 0.5.23 skips the
    #: radix-cache insert for it, so it warms nothing there; only for workers known to cache it)
    warm_via: str = "auto"
    warm_fake_timeout_s: float = 5.0
    #: how pins are kept (core/routing/prefixes.py, "Pins"): touch (warmed again after pin_touch_s without
    #: traffic; an ended pin ages out like any prefix) or priority (warm-ups carry pin_priority, which
    #: workers running --radix-eviction-policy priority keep, but SGLang never lowers a node's priority:
    #: the pin stays on the worker after it expires or is superseded, until the worker restarts)
    pin_via: str = "touch"
    pin_touch_s: float = 5.0
    #: priority sent with pinned warm-ups under pin_via priority
    pin_priority: int = 1_000_000
    model_name: str | None = None
    log_requests: bool = False
    #: speculative acceptance (router/observe/spec_stats.py): rolling window per decode and label, in requests,
    #: and the number of workload labels kept per decode (more are counted as "other")
    spec_window_requests: int = 200
    #: the draft's cost per step relative to the target's (speculative.cost_ratio): the spans' speedup model
    spec_cost_ratio: float = 0.1
    #: pair health (core/routing/pair_health.py): KV floors, runs that degrade a pair, probe wait
    pair_min_kv_speed_gb_s: float | None = None
    pair_max_kv_latency_ms: float | None = None
    pair_bad_samples: int = 3
    pair_max_failures: int = 3
    pair_probe_after_s: float = 60.0
    spec_max_labels: int = 16
    #: KV events (router/kvindex/kv_routing.py): subscribe to the workers that advertise them; the target
    #: model's directory (tokenizer.json, tokenizer_config.json) to tokenize prompts as real SGLang
    #: workers do (simulated workers name their own); stream limits (router/kvindex/kv_subscriber.py); from
    #: the profile's router.kv_events and `router serve --kv-*` (router/kvindex/kv_settings.py)
    kv_events: bool = True
    tokenizer_path: str | None = None
    kv_max_blocks: int = 4_000_000
    kv_max_blocks_per_medium: int | None = None
    kv_replay_timeout_s: float = 2.0
    kv_max_batches_per_s: int = 5000
    kv_max_message_bytes: int = 8 << 20
    #: the longest prompt (characters) the exact index anchors; longer ones route on the predicted index
    kv_anchor_max_chars: int = 256 << 10
    #: in-flight prefix coalescing (router/request/coalesce.py; the profile's router.coalesce)
    coalesce: bool = True
    #: with several router processes: coalesce across them (the flight board, router/fleet/shared_flights.py)
    coalesce_processes: bool = True
    coalesce_min_tokens: int = 256
    coalesce_max_wait_s: float = 2.0
    #: KV tiers (core/routing/tiers.py, docs/router.md "KV tiers"): how a prompt cached in a worker's
    #: HiCache host memory counts next to one in HBM. aware: the load-time model's weight from the
    #: numbers below (None: the defaults there, Llama-3.1-70B BF16 on 8 x H100); blind: every tier as
    #: HBM; device: HBM only (host pages ignored)
    kv_tiers: str = "aware"
    kv_bytes_per_token_per_rank: int | None = None
    prefill_tokens_per_s: float | None = None
    host_gb_s: float | None = None
    storage_gb_s: float | None = None
    #: tenants (router/observe/tenants.py: keys hashed, limits), the header naming them when none has a key,
    #: each worker role's price in $/s (router.pricing) and tracing (router/observe/tracing.py; None: off)
    tenants: list[TenantSpec] = field(default_factory=list)
    tenant_header: str = "x-inferctl-tenant"
    #: header mode: the CIDRs whose connections may name a tenant by header (empty: any client may)
    tenant_trusted_proxies: list[str] = field(default_factory=list)
    worker_usd_per_s: dict[str, float] = field(default_factory=dict)
    tracing: TracingConfig | None = None
    #: several replicas (router/scaleout/state_sync.py): every replica's listen address, the Redis URL they share
    #: named prefixes and worker changes through (None: this router keeps its state to itself), its
    #: password (from the environment) and the key namespace (the profile's name)
    replicas: list[str] = field(default_factory=list)
    state_store: str | None = None
    state_store_password: str | None = None
    state_namespace: str = "default"

    @property
    def mode(self) -> str:
        return "pd" if any(w.role in ("prefill", "decode") for w in self.workers) else "collocated"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def validate(self) -> None:
        """Refuse configurations that would be unsafe or cannot route."""
        if not is_loopback(self.host) and not self.admin_token:
            raise UsageError(
                f"refusing to serve the admin API on non-loopback address {self.host} without a token",
                remedy=f"export {self.admin_token_env}=<secret> (bearer token for /admin), or listen on 127.0.0.1",
            )
        roles = {w.role for w in self.workers}
        if "mixed" in roles and roles & {"prefill", "decode"}:
            raise UsageError("cannot mix collocated workers with prefill/decode workers in one router",
                             remedy="run one router per mode")
        if self.workers and self.mode == "pd" and not ({"prefill", "decode"} <= roles):
            raise UsageError("PD mode needs at least one prefill and one decode worker",
                             remedy="give --prefill URL[@BOOTSTRAP_PORT] and --decode URL")
        for name, (kind, lo, above, hi) in _BOUNDS.items():
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                _check_number(name, value, kind, lo, above, hi)
        self.tier_weights()
        self.coalesce_config()
        if self.policy not in ("cache_aware", "round_robin", "power_of_two", "random"):
            raise UsageError(f"unknown policy {self.policy!r}",
                             remedy="use cache_aware, round_robin, power_of_two or random")
        if self.miss_placement not in MISS_PLACEMENTS:
            raise UsageError(f"router.miss_placement must be {' or '.join(MISS_PLACEMENTS)}, got {self.miss_placement!r}",
                             remedy="router.miss_placement (or `router serve --miss-placement`): power_of_two or rendezvous")


    def coalesce_config(self) -> CoalesceConfig:
        try:
            return CoalesceConfig(self.coalesce, self.coalesce_min_tokens, self.coalesce_max_wait_s)
        except ValueError as exc:
            raise UsageError(str(exc), remedy="router.coalesce: min_tokens >= 1, max_wait_s > 0") from None

    def tier_weights(self) -> TierWeights | None:
        """The exact index's tier weights (None: only HBM counts); computed once, at start-up."""
        if self.kv_tiers == "device":
            return None
        if self.kv_tiers == "blind":
            return BLIND
        if self.kv_tiers != "aware":
            raise UsageError(f"kv_tiers must be aware, blind or device, got {self.kv_tiers!r}",
                             remedy="router.tiers.mode: aware (weigh host hits by their load time), blind or device")

        def given(v: float | None, default: float) -> float:
            return default if v is None else v

        try:
            return weights_from(
                kv_bytes_per_token_per_rank=given(self.kv_bytes_per_token_per_rank,  # checked there, by name
                                                  DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK),
                prefill_tokens_per_s=given(self.prefill_tokens_per_s, DEFAULT_PREFILL_TOKENS_PER_S),
                host_gb_s=given(self.host_gb_s, DEFAULT_HOST_GB_S), storage_gb_s=self.storage_gb_s)
        except ValueError as exc:
            raise UsageError(f"router tier weights: {exc}",
                             remedy="router.tiers: give positive numbers (docs/router.md, \"KV tiers\")") from None


def is_loopback(host: str) -> bool:
    """Only literal loopback addresses and `localhost` count: a name such as `127.example.com` can
    resolve anywhere."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--listen {listen!r} is not HOST:PORT (port 0-65535)", remedy="e.g. --listen 127.0.0.1:8000")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_prefill(arg: str) -> WorkerSpec:
    """`http://host:port` or `http://host:port@BOOTSTRAP_PORT` (or `URL BOOTSTRAP` with a space)."""
    url, bp = arg, None
    for sep in ("@", " "):
        if sep in arg:
            url, _, tail = arg.rpartition(sep)
            if not tail.isdigit():
                raise UsageError(f"bad bootstrap port in {arg!r}", remedy="use URL@PORT, e.g. http://10.0.0.11:30000@8998")
            bp = int(tail)
            break
    return WorkerSpec(_norm_url(url), "prefill", bp)


def _norm_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if not url.startswith("http://"):
        raise UsageError(f"worker URL {url!r} must be http://host:port", remedy="TLS to workers is not supported; use a private network")
    return url


def worker(url: str, role: Role, bootstrap_port: int | None = None) -> WorkerSpec:
    return WorkerSpec(_norm_url(url), role, bootstrap_port)


def _read_prefix_text(base: Path, text: str | None, file: str | None) -> str:
    if text is not None:
        return text
    assert file is not None
    path = Path(os.path.expanduser(file))
    if not path.is_absolute():
        path = base / path
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read prefix file {path}: {exc.strerror}", remedy="fix router.prefixes[].file") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"prefix file {path} is not UTF-8 text (byte {exc.start})",
                         remedy="save the prompt as UTF-8") from None


def from_profile(profile: Profile, *, listen: str | None = None, workers: list[WorkerSpec] | None = None,
                 env: dict[str, str] | None = None) -> RouterConfig:
    """The router of a profile: its listen address, settings, named prefixes and (unless `workers` is
    given) its prefill/decode or collocated servers."""
    rs = profile.router
    env = dict(os.environ) if env is None else env
    host, port = parse_listen(listen or rs.listen)
    if workers is None:
        workers = []
        for node in profile.nodes:
            ports = profile.server_ports(node)
            if "collocated" in ports:
                workers.append(worker(f"http://{node.host}:{ports['collocated']}", "mixed"))
            if "prefill" in ports:
                workers.append(worker(f"http://{node.host}:{ports['prefill']}", "prefill", ports["bootstrap"]))
            if "decode" in ports:
                workers.append(worker(f"http://{node.host}:{ports['decode']}", "decode"))
    prefixes = [
        PrefixSpec(p.name, _read_prefix_text(profile.base_dir, p.text, p.file), p.ttl_s, p.replicas, p.pin,
                   p.format, p.keep)
        for p in rs.prefixes
    ]
    cfg = RouterConfig(
        nvlink_domains={n.host: n.nvlink_domain for n in profile.nodes if n.nvlink_domain},
        host=host, port=port, workers=workers, policy=rs.policy, prefix_ttl_s=rs.prefix_ttl_s,
        index_max_tokens=rs.index_max_tokens, health_interval_s=rs.health_interval_s,
        request_timeout_s=rs.request_timeout_s, max_concurrent=rs.max_concurrent, max_connections=rs.max_connections,
        max_body_bytes=rs.max_body_bytes, max_retries=rs.max_retries, admin_token_env=rs.admin_token_env,
        admin_token=env.get(rs.admin_token_env) or None, prefixes=prefixes,
        model_name=profile.models.target.path if profile.models else None,
        tokenizer_path=(profile.models.target.tokenizer_path or profile.models.target.path) if profile.models else None,
        max_queue=rs.max_queue, cache_threshold=rs.cache_threshold, balance_abs=rs.balance_abs,
        balance_rel=rs.balance_rel, miss_placement=rs.miss_placement, rewarm_idle_s=rs.rewarm_idle_s, drain_timeout_s=rs.drain_timeout_s,
        stream_recovery=rs.stream_recovery, pin_via=rs.pin_via, pin_touch_s=rs.pin_touch_s,
        cb_failures=rs.cb_failures, cb_open_s=rs.cb_open_s, health_holddown_max_s=rs.health_holddown_max_s,
        spec_window_requests=profile.speculative.window_requests,
        spec_cost_ratio=profile.speculative.cost_ratio if profile.speculative.cost_ratio is not None else 0.1,
        pair_min_kv_speed_gb_s=rs.pair_health.min_kv_speed_gb_s, pair_max_kv_latency_ms=rs.pair_health.max_kv_latency_ms,
        pair_bad_samples=rs.pair_health.bad_samples, pair_max_failures=rs.pair_health.max_transfer_failures,
        pair_probe_after_s=rs.pair_health.probe_after_s,
        kv_tiers=rs.tiers.mode, kv_bytes_per_token_per_rank=rs.tiers.kv_bytes_per_token_per_rank,
        prefill_tokens_per_s=rs.tiers.prefill_tokens_per_s, host_gb_s=rs.tiers.host_gb_s,
        storage_gb_s=rs.tiers.storage_gb_s, coalesce=rs.coalesce.enabled,
        coalesce_min_tokens=rs.coalesce.min_tokens, coalesce_max_wait_s=rs.coalesce.max_wait_s,
    )
    cfg.tenants = specs_from_profile(profile, env)
    cfg.tenant_header = rs.tenant_header
    cfg.tenant_trusted_proxies = [str(n) for n in rs.tenant_trusted_proxies]
    cfg.worker_usd_per_s = prices_from_profile(profile)
    cfg.tracing = config_from(rs.tracing, env)
    apply_kv_profile(cfg, profile)  # router.kv_events (router/kvindex/kv_settings.py)
    _replicas_from(cfg, profile, env)
    return cfg


def _replicas_from(cfg: RouterConfig, profile: Profile, env: dict[str, str]) -> None:
    rs = profile.router
    cfg.replicas, cfg.state_store, cfg.state_namespace = list(rs.replicas), rs.state_store, profile.name
    if rs.replicas and not any(parse_listen(r) == (cfg.host, cfg.port) for r in rs.replicas):
        raise UsageError(f"this router listens on {cfg.host}:{cfg.port}, which router.replicas does not list "
                         f"({', '.join(rs.replicas)})", remedy="give --listen one of router.replicas, or add it there")
    if rs.state_store_password_env:
        cfg.state_store_password = env.get(rs.state_store_password_env)
        if not cfg.state_store_password:
            raise UsageError(f"router.state_store_password_env names {rs.state_store_password_env}, which is not set",
                             remedy=f"export {rs.state_store_password_env}=<the store's password>")


#: The numbers a RouterConfig set in code (embedding, tests, flags) must hold, beyond the profile's
#: schema, which bounds what a profile gives more tightly: (whole number or not, lowest, whether the
#: lowest itself is refused, highest). What they guard: a NaN compares false with everything (a NaN timeout
#: never fires, a NaN interval spins), a string or None fails deep in the request path as an internal
#: error, and a zero count divides or never trips.
_BOUNDS: dict[str, tuple[type, float, bool, float | None]] = {
    "cache_threshold": (float, 0.0, False, 1.0),
    "prefix_ttl_s": (float, 0.0, True, None),
    "index_max_tokens": (int, 1, False, None),
    "block_chars": (int, 1, False, None),
    "health_interval_s": (float, 0.0, True, None),
    "health_timeout_s": (float, 0.0, True, None),
    "health_failures": (int, 1, False, None),
    "health_successes": (int, 1, False, None),
    "cb_failures": (int, 1, False, None),
    "cb_open_s": (float, 0.0, True, None),
    "cb_successes": (int, 1, False, None),
    "request_timeout_s": (float, 0.0, True, None),
    "max_concurrent": (int, 1, False, None),
    "max_connections": (int, 1, False, None),
    "max_queue": (int, 0, False, None),
    "queue_timeout_s": (float, 0.0, True, None),
    "max_body_bytes": (int, 1, False, None),
    "max_retries": (int, 0, False, None),
    "retry_base_s": (float, 0.0, False, None),
    "drain_timeout_s": (float, 0.0, False, None),
    "rewarm_idle_s": (float, 0.0, True, None),
    "warm_fake_timeout_s": (float, 0.0, True, None),
    "spec_window_requests": (int, 1, False, None),
    "spec_max_labels": (int, 1, False, None),
    "pair_bad_samples": (int, 1, False, None),
    "pair_max_failures": (int, 1, False, None),
    "pair_probe_after_s": (float, 0.0, True, None),
    "kv_max_blocks": (int, 1, False, None),
    "kv_max_blocks_per_medium": (int, 1, False, None),
    "kv_replay_timeout_s": (float, 0.0, True, None),
    "kv_max_batches_per_s": (int, 1, False, None),
    "kv_max_message_bytes": (int, 1, False, None),
    "kv_anchor_max_chars": (int, 1, False, None),
    "coalesce_min_tokens": (int, 1, False, None),
    # the profile's bounds: a string or None failed in math.isfinite as an internal error, and a day-plus
    # hold-down cap passed
    "health_holddown_max_s": (float, 0.0, False, 86400.0),
    # the load guard (router.balance_abs ge=0, balance_rel ge=1): a negative guard takes every cache hit off
    # the least loaded worker too, and a NaN one turns the guard off without a word
    "balance_abs": (int, 0, False, None),
    "balance_rel": (float, 1.0, False, None),
    # the profile's le=60; a NaN one coalesce_config refused, an infinite one held a request for its leader
    # as long as the request's timeout
    "coalesce_max_wait_s": (float, 0.0, True, 60.0),
    "port": (int, 0, False, 65535),  # 0: any free port (tests, embedding)
    "pair_min_kv_speed_gb_s": (float, 0.0, True, None),
    "pair_max_kv_latency_ms": (float, 0.0, True, None),
}

#: Those of them None leaves unset: the pair-health floors (a NaN floor judged no transfer bad; a string
#: one raised TypeError in the prefill's health checks once requests went through it, and what those
#: checks found was never applied), max_connections (chosen from RLIMIT_NOFILE at start) and
#: kv_max_blocks_per_medium (no bound beside kv_max_blocks)
_OPTIONAL = frozenset({"pair_min_kv_speed_gb_s", "pair_max_kv_latency_ms", "max_connections",
                       "kv_max_blocks_per_medium"})

#: What to say beyond the bounds, where a flag or a meaning helps
_HINTS = {
    "balance_abs": "router.balance_abs (or `router serve --balance-abs N`): e.g. 8",
    "balance_rel": "router.balance_rel: e.g. 1.5",
    "health_holddown_max_s": "router.health_holddown_max_s: e.g. 60 (0 turns flap damping off)",
}


def _check_number(name: str, value: object, kind: type, lo: float, above: bool, hi: float | None) -> None:
    whole = kind is int
    ok = (not isinstance(value, bool) and isinstance(value, int if whole else int | float)
          and _finite(value, whole) and (value > lo if above else value >= lo)
          and (hi is None or value <= hi))
    if not ok:
        what = "a whole number" if whole else "a finite number"
        bound = ((f"above {lo:g}, at most {hi:g}" if above else f"{lo:g} to {hi:g}") if hi is not None
                 else f"above {lo:g}" if above else f"{lo:g} or more")
        default = getattr(RouterConfig, name)
        raise UsageError(f"router.{name} must be {what}, {bound}, got {value!r}",
                         remedy=_HINTS.get(name, f"leave {name} at its default ({default!r}) or give one in those bounds"))


def _finite(value: float, whole: bool) -> bool:
    """An int given for seconds is used as a float: one past the largest float is no number of seconds
    (math.isfinite(10 ** 400) raised OverflowError, as the timer would); a count is an int of any size."""
    if isinstance(value, int):
        return whole or abs(value) <= sys.float_info.max
    return math.isfinite(value)
