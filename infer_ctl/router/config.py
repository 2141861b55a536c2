"""Everything the daemon needs to run, resolved from a profile plus command-line/programmatic overrides."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from infer_ctl.core.routing.breaker import CircuitBreaker
from infer_ctl.core.routing.coalesce import CoalesceConfig
from infer_ctl.core.routing.index import BLOCK_CHARS, PrefixIndex
from infer_ctl.core.routing.pair_health import PairFloor
from infer_ctl.core.routing.policy import PolicyConfig
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.core.routing.tiers import (
    BLIND,
    DEFAULT_HOST_GB_S,
    DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK,
    DEFAULT_PREFILL_TOKENS_PER_S,
    TierWeights,
    weights_from,
)
from infer_ctl.core.routing.units import CHARS_PER_TOKEN
from infer_ctl.errors import UsageError
from infer_ctl.profile.errors import format_validation_error
from infer_ctl.profile.router import NamedPrefix, RouterSettings
from infer_ctl.profile.speculative import DEFAULT_COST_RATIO, SpeculativeSettings
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.kvindex.kv_settings import checked_tokenizer
from infer_ctl.router.kvindex.kv_subscriber import StreamSettings
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


#: a named prefix's defaults, from its one declaration (profile/router.py NamedPrefix)
_NAMED = {name: info.default for name, info in NamedPrefix.model_fields.items()}


@dataclass(frozen=True)
class PrefixSpec:
    """A named prefix resolved: its text read (router.prefixes[], profile/router.py NamedPrefix)."""

    name: str
    text: str
    ttl_s: float | None = _NAMED["ttl_s"]
    replicas: int = _NAMED["replicas"]
    pin: bool = _NAMED["pin"]
    fmt: str = _NAMED["format"]
    keep: str | None = _NAMED["keep"]


#: the settings' defaults (host and port below come from their `listen`)
_DEFAULTS = RouterSettings()


@dataclass
class RouterConfig:
    """The daemon's run-time object: `settings` (the profile's `router:` section with any flag or
    embedding overrides: the one declaration of every tunable, its default and its bounds,
    profile/router.py) plus what is not a setting: the listen address in use, the workers, the named
    prefixes' texts, secrets read from the environment and what other profile sections give."""

    settings: RouterSettings = field(default_factory=RouterSettings)
    host: str = _DEFAULTS.listen_host
    port: int = _DEFAULTS.listen_port
    workers: list[WorkerSpec] = field(default_factory=list)
    #: worker host -> its NVLink domain (the profile's nodes[].nvlink_domain): a decode in the prefill's domain
    #: is preferred when it is about as loaded as the least loaded one
    nvlink_domains: dict[str, str] = field(default_factory=dict)
    #: the bearer token for /admin, read from the variable settings.admin_token_env names
    admin_token: str | None = None
    prefixes: list[PrefixSpec] = field(default_factory=list)
    model_name: str | None = None
    #: the target model's directory (tokenizer.json, tokenizer_config.json) to tokenize prompts as real
    #: SGLang workers do (simulated workers name their own): router.kv_events.tokenizer_path, `router
    #: serve --kv-tokenizer` (both checked at start, router/kvindex/kv_settings.py) or the model's path
    tokenizer_path: str | None = None
    #: speculative acceptance (router/observe/spec_stats.py): the profile's speculative.window_requests, the
    #: rolling window per decode and label in requests, and speculative.cost_ratio, the draft's cost per
    #: step relative to the target's (the spans' speedup model)
    spec_window_requests: int = SpeculativeSettings.model_fields["window_requests"].default
    spec_cost_ratio: float = DEFAULT_COST_RATIO
    #: tenants (router/observe/tenants.py: keys hashed, limits), each worker role's price in $/s
    #: (router.pricing) and tracing (router/observe/tracing.py; None: off)
    tenants: list[TenantSpec] = field(default_factory=list)
    worker_usd_per_s: dict[str, float] = field(default_factory=dict)
    tracing: TracingConfig | None = None
    #: several replicas (router/scaleout/state_sync.py, settings.replicas and settings.state_store): the
    #: store's password (from the environment) and the key namespace (the profile's name)
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
        """Refuse configurations that would be unsafe or cannot route (the settings' own bounds were
        checked when they were built: profile/router.py, `router_settings`)."""
        if not is_loopback(self.host) and not self.admin_token:
            raise UsageError(
                f"refusing to serve the admin API on non-loopback address {self.host} without a token",
                remedy=f"export {self.settings.admin_token_env}=<secret> (bearer token for /admin), or listen on 127.0.0.1",
            )
        roles = {w.role for w in self.workers}
        if "mixed" in roles and roles & {"prefill", "decode"}:
            raise UsageError("cannot mix collocated workers with prefill/decode workers in one router",
                             remedy="run one router per mode")
        if self.workers and self.mode == "pd" and not ({"prefill", "decode"} <= roles):
            raise UsageError("PD mode needs at least one prefill and one decode worker",
                             remedy="give --prefill URL[@BOOTSTRAP_PORT] and --decode URL")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise UsageError(f"router.port must be a whole number, 0 to 65535, got {self.port!r}",
                             remedy="0: any free port (tests, embedding)")
        self.tier_weights()
        coalesce_config(self.settings)

    def tier_weights(self) -> TierWeights | None:
        """The exact index's tier weights (None: only HBM counts); computed once, at start-up."""
        tiers = self.settings.tiers
        if tiers.mode == "device":
            return None
        if tiers.mode == "blind":
            return BLIND

        def given(v: float | None, default: float) -> float:
            return default if v is None else v

        try:
            return weights_from(
                kv_bytes_per_token_per_rank=given(tiers.kv_bytes_per_token_per_rank,  # checked there, by name
                                                  DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK),
                prefill_tokens_per_s=given(tiers.prefill_tokens_per_s, DEFAULT_PREFILL_TOKENS_PER_S),
                host_gb_s=given(tiers.host_gb_s, DEFAULT_HOST_GB_S), storage_gb_s=tiers.storage_gb_s)
        except ValueError as exc:
            raise UsageError(f"router tier weights: {exc}",
                             remedy="router.tiers: give positive numbers (docs/router.md, \"KV tiers\")") from None


def policy_config(settings: RouterSettings) -> PolicyConfig:
    """The routing policy's inputs (core/routing/policy.py) from the settings: built here only."""
    s = settings
    return PolicyConfig(policy=s.policy, cache_threshold=s.cache_threshold, balance_abs=s.balance_abs,
                        balance_rel=s.balance_rel, miss_placement=s.miss_placement)


def circuit_breaker(settings: RouterSettings) -> CircuitBreaker:
    """A worker's circuit breaker (core/routing/breaker.py) from the settings: built here only."""
    return CircuitBreaker(failure_threshold=settings.cb_failures, success_threshold=settings.cb_successes,
                          open_s=settings.cb_open_s)


def pair_floor(settings: RouterSettings) -> PairFloor:
    """The pair-health floor (core/routing/pair_health.py) from router.pair_health: built here only."""
    ph = settings.pair_health
    return PairFloor(min_speed_gb_s=ph.min_kv_speed_gb_s, max_latency_ms=ph.max_kv_latency_ms,
                     bad_samples=ph.bad_samples, max_failures=ph.max_transfer_failures, probe_after_s=ph.probe_after_s)


def prefix_registry(settings: RouterSettings) -> PrefixRegistry:
    """The named prefixes' registry (core/routing/prefixes.py) from the settings: with several replicas (a
    state store) a prefix is placed on the same workers by rendezvous hash, not by each one's own view of
    the load; pins are kept by touching unless by priority (the registry plans the touches, the warmer
    sends them)."""
    return PrefixRegistry(rewarm_idle_s=settings.rewarm_idle_s, shared_placement=bool(settings.state_store),
                          pin_touch_s=None if settings.pin_via == "priority" else settings.pin_touch_s)


def coalesce_config(settings: RouterSettings) -> CoalesceConfig:
    """In-flight prefix coalescing's inputs (core/routing/coalesce.py) from the settings: built here only."""
    co = settings.coalesce
    try:
        return CoalesceConfig(enabled=co.enabled, min_tokens=co.min_tokens, max_wait_s=co.max_wait_s)
    except ValueError as exc:
        raise UsageError(str(exc), remedy="router.coalesce: min_tokens >= 1, max_wait_s > 0") from None


def prefix_index(settings: RouterSettings, block_chars: int = BLOCK_CHARS) -> PrefixIndex:
    """The predicted index (core/routing/index.py) from the settings: index_max_tokens converted to its
    blocks at CHARS_PER_TOKEN (core/routing/units.py)."""
    return PrefixIndex(ttl_s=settings.prefix_ttl_s, block_chars=block_chars,
                       max_blocks=max(1, int(settings.index_max_tokens * CHARS_PER_TOKEN) // block_chars))


def stream_settings(settings: RouterSettings) -> StreamSettings:
    """A KV-event stream's bounds (router/kvindex/kv_subscriber.py) from router.kv_events: built here only."""
    kv = settings.kv_events
    return StreamSettings(max_blocks=kv.max_blocks, max_blocks_per_medium=kv.max_blocks_per_medium,
                          max_message_bytes=kv.max_message_bytes, replay_timeout_s=kv.replay_timeout_s,
                          max_batches_per_s=kv.max_batches_per_s)


def kv_routing(cfg: RouterConfig, *, metrics: Any = None, chars_per_token: Callable[[], float] | None = None,
               processes: int = 1) -> KvRouting:
    """The exact index (router/kvindex/kv_routing.py) from the settings: on with router.kv_events.enabled
    under the cache_aware policy (the only one that reads it)."""
    s = cfg.settings
    return KvRouting(enabled=s.kv_events.enabled and s.policy == "cache_aware", settings=stream_settings(s),
                     tier_weights=cfg.tier_weights(), anchor_max_chars=s.kv_events.anchor_max_chars,
                     tokenizer_path=cfg.tokenizer_path, metrics=metrics, chars_per_token=chars_per_token,
                     processes=processes)


def router_settings(base: RouterSettings | None = None, /, **overrides: Any) -> RouterSettings:
    """`base` (default: the defaults) with `overrides`, validated by the same model as a profile's
    `router:` section, so a flag or a value set in code meets the same bounds; a bad one is a UsageError
    naming router.<field>. A nested group is given as a dict of its own fields, merged into base's
    (`kv_events={"enabled": False}` keeps the other kv_events settings)."""
    base = base or _DEFAULTS
    data = base.model_dump()
    for key, value in overrides.items():
        group = data.get(key)
        if isinstance(group, dict) and isinstance(value, Mapping):
            data[key] = {**group, **value}
        else:
            data[key] = value
    try:
        # strict: a string or None given for a number in code is refused, not read as one (the profile's
        # YAML gives each value its type, so the same data validates the same way there)
        return RouterSettings.model_validate(data, strict=True)
    except ValidationError as exc:
        lines = [f"router.{line}" for line in format_validation_error(RouterSettings, exc)]
        raise UsageError("; ".join(lines),
                         remedy="give a value in those bounds, or leave the setting at its default "
                                "(docs/profile.md, router)") from None


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
    kv = rs.kv_events
    tokenizer = (profile.models.target.tokenizer_path or profile.models.target.path) if profile.models else None
    if kv.tokenizer_path is not None and kv.enabled:
        tokenizer = checked_tokenizer(kv.tokenizer_path, "router.kv_events.tokenizer_path", profile.base_dir)
    cost_ratio = profile.speculative.cost_ratio
    cfg = RouterConfig(
        settings=rs, host=host, port=port, workers=workers,
        nvlink_domains={n.host: n.nvlink_domain for n in profile.nodes if n.nvlink_domain},
        admin_token=env.get(rs.admin_token_env) or None, prefixes=prefixes,
        model_name=profile.models.target.path if profile.models else None, tokenizer_path=tokenizer,
        spec_window_requests=profile.speculative.window_requests,
        spec_cost_ratio=DEFAULT_COST_RATIO if cost_ratio is None else cost_ratio,
        tenants=specs_from_profile(profile, env), worker_usd_per_s=prices_from_profile(profile),
        tracing=config_from(rs.tracing, env),
    )
    _replicas_from(cfg, profile, env)
    return cfg


def _replicas_from(cfg: RouterConfig, profile: Profile, env: dict[str, str]) -> None:
    rs = profile.router
    cfg.state_namespace = profile.name
    if rs.replicas and not any(parse_listen(r) == (cfg.host, cfg.port) for r in rs.replicas):
        raise UsageError(f"this router listens on {cfg.host}:{cfg.port}, which router.replicas does not list "
                         f"({', '.join(rs.replicas)})", remedy="give --listen one of router.replicas, or add it there")
    if rs.state_store_password_env:
        cfg.state_store_password = env.get(rs.state_store_password_env)
        if not cfg.state_store_password:
            raise UsageError(f"router.state_store_password_env names {rs.state_store_password_env}, which is not set",
                             remedy=f"export {rs.state_store_password_env}=<the store's password>")
