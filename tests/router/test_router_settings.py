"""One router settings type (issue 27 item 1): the profile's RouterSettings (profile/router.py) is the only
declaration of every router setting, its default and its bounds. RouterConfig (router/config.py) holds it
plus run-time values only, PolicyConfig (core/routing/policy.py) and the other parts built from the settings
(router/config.py: the streams' bounds, coalescing, the predicted and exact indexes, the breaker, the pair
floor, the prefix registry) declare no default for them, `router serve` flags default to "not given", and
an override from a flag or from code meets the profile's bounds."""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from infer_ctl.cli.main import main
from infer_ctl.core.routing.blocks import WorkerBlocks
from infer_ctl.core.routing.breaker import CircuitBreaker
from infer_ctl.core.routing.coalesce import CoalesceConfig
from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.pair_health import PairFloor
from infer_ctl.core.routing.policy import MISS_PLACEMENTS, POLICIES, PolicyConfig
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.core.routing.retry import backoff_s
from infer_ctl.core.routing.units import CHARS_PER_TOKEN
from infer_ctl.errors import UsageError
from infer_ctl.profile.router import NamedPrefix, RouterSettings
from infer_ctl.profile.speculative import DEFAULT_COST_RATIO, SpeculativeSettings
from infer_ctl.router.config import (
    PrefixSpec,
    RouterConfig,
    circuit_breaker,
    coalesce_config,
    kv_routing,
    pair_floor,
    policy_config,
    prefix_index,
    prefix_registry,
    router_settings,
    stream_settings,
)
from infer_ctl.router.control.client import AdminClient
from infer_ctl.router.daemon.embed import router_config
from infer_ctl.router.kvindex.kv_anchoring import Anchoring
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.kvindex.kv_subscriber import StreamSettings
from infer_ctl.router.kvindex.replay_cursor import ReplayCursor
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.router.request.coalesce import Coalescer

_LOWER = (annotated_types.Ge, annotated_types.Gt)


def _numbers(annotation: Any, metadata: list[Any]) -> tuple[type | None, list[Any]]:
    """The number type a field holds (int or float; None: not a number) and the constraints on it,
    looking inside Annotated and Optional."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        inner, *extra = typing.get_args(annotation)
        found = [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        return _numbers(inner, [*metadata, *found])
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            kind, meta = _numbers(arg, metadata)
            if kind is not None:
                return kind, meta
        return None, metadata
    if annotation in (int, float):
        return annotation, metadata
    return None, metadata


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The settings groups a field holds directly (a model, or an optional one; lists of named
    prefixes and tenants are data, not groups)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _models(a)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _walk(model: type[BaseModel], prefix: str = "router") -> list[tuple[str, FieldInfo, type[BaseModel]]]:
    out = []
    for name, info in model.model_fields.items():
        out.append((f"{prefix}.{name}", info, model))
        for sub in _models(info.annotation):
            out += _walk(sub, f"{prefix}.{name}")
    return out


FIELDS = _walk(RouterSettings)
NUMBERS = [(path, info, model) for path, info, model in FIELDS if _numbers(info.annotation, info.metadata)[0]]


def test_the_walk_sees_the_groups_and_the_settings_once_only_in_routerconfig() -> None:
    paths = {path for path, _, _ in FIELDS}
    for leaf in ("router.health_timeout_s", "router.queue_timeout_s", "router.retry_base_s", "router.cb_successes",
                 "router.pin_priority", "router.warm_fake_timeout_s", "router.spec_max_labels",
                 "router.kv_events.max_blocks", "router.coalesce.processes", "router.pair_health.bad_samples",
                 "router.tiers.host_gb_s", "router.decode_capacity", "router.log_requests", "router.warm_via"):
        assert leaf in paths, leaf
    assert len(NUMBERS) > 30


@pytest.mark.parametrize(("path", "info", "model"), NUMBERS, ids=[p for p, _, _ in NUMBERS])
def test_every_number_has_one_default_and_a_bound(path: str, info: FieldInfo, model: type[BaseModel]) -> None:
    kind, meta = _numbers(info.annotation, info.metadata)
    assert not info.is_required(), f"{path} has no default"
    assert any(isinstance(m, _LOWER) for m in meta), f"{path} has no lower bound"
    if kind is float:  # finite: on the field or on its model
        finite = [m.allow_inf_nan for m in meta if getattr(m, "allow_inf_nan", None) is not None]
        assert finite == [False] or model.model_config.get("allow_inf_nan") is False, f"{path} takes NaN"
    if info.default is not None:  # the default is inside the bound
        for m in meta:
            for attr, ok in (("ge", lambda d, b: d >= b), ("gt", lambda d, b: d > b), ("le", lambda d, b: d <= b),
                             ("lt", lambda d, b: d < b)):
                if hasattr(m, attr):
                    assert ok(info.default, getattr(m, attr)), f"{path} default {info.default} breaks {m}"


def test_routerconfig_holds_the_settings_and_no_setting_of_its_own() -> None:
    settings = {path.split(".")[-1] for path, _, _ in FIELDS}
    own = {f.name for f in dataclasses.fields(RouterConfig)} - {"settings"}
    # the resolved forms of four settings: prefix texts read from files, tenants with hashed keys, the
    # tracing config with the environment's OTEL_* applied, the tokenizer checked (or the model's path);
    # each empty until from_profile fills it
    resolved = {"prefixes", "tenants", "tracing", "tokenizer_path"}
    assert own & settings == resolved, own & settings
    plain = RouterConfig()
    assert (plain.prefixes, plain.tenants, plain.tracing, plain.tokenizer_path) == ([], [], None, None)
    # the run-time defaults that are numbers come from their one declaration
    assert (plain.host, plain.port) == (RouterSettings().listen_host, RouterSettings().listen_port)
    assert plain.spec_window_requests == SpeculativeSettings().window_requests
    assert plain.spec_cost_ratio == DEFAULT_COST_RATIO
    assert plain.settings == RouterSettings()


def test_policyconfig_has_no_defaults_for_settings() -> None:
    settings = set(RouterSettings.model_fields)
    for f in dataclasses.fields(PolicyConfig):
        if f.name in settings:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
    built = policy_config(RouterSettings())
    assert (built.policy, built.cache_threshold, built.balance_abs, built.balance_rel, built.miss_placement) == (
        "cache_aware", 0.3, 8, 1.5, "power_of_two")


#: the router's parts that take settings, and the parameters the settings give them (router/config.py
#: builds each from the settings): none has a default of its own, so no default is repeated below the model
SETTINGS_PARAMETERS: list[tuple[Any, set[str]]] = [
    (StreamSettings, {"max_blocks", "max_blocks_per_medium", "max_message_bytes", "replay_timeout_s",
                      "max_batches_per_s"}),
    (CoalesceConfig, {"enabled", "min_tokens", "max_wait_s"}),
    (PrefixIndex, {"ttl_s", "max_blocks"}),
    (KvRouting, {"enabled", "settings", "tier_weights", "anchor_max_chars", "tokenizer_path"}),
    (Anchoring, {"anchor_max_chars"}),
    (Coalescer, {"cfg", "max_retries"}),
    (WorkerBlocks, {"max_blocks", "max_blocks_per_medium"}),
    (ReplayCursor, {"timeout_s"}),
    (CircuitBreaker, {"failure_threshold", "success_threshold", "open_s"}),
    (PairFloor, {"min_speed_gb_s", "max_latency_ms", "bad_samples", "max_failures", "probe_after_s"}),
    (PrefixRegistry, {"rewarm_idle_s", "shared_placement", "pin_touch_s"}),
    (SpecStats, {"window", "max_labels"}),
    (backoff_s, {"base_s"}),
]


@pytest.mark.parametrize(("part", "names"), SETTINGS_PARAMETERS, ids=[p.__name__ for p, _ in SETTINGS_PARAMETERS])
def test_the_parts_take_their_settings_without_defaults(part: Any, names: set[str]) -> None:
    params = inspect.signature(part).parameters
    assert names <= set(params), names - set(params)
    for name in names:
        assert params[name].default is inspect.Parameter.empty, (part.__name__, name, params[name].default)
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY or name == "cfg", name  # cfg: the group itself
    # and no other parameter named as a setting repeats that setting's default
    defaults: dict[str, list[Any]] = {}
    for path, info, _ in FIELDS:
        defaults.setdefault(path.rsplit(".", 1)[1], []).append(info.default)
    for name, param in params.items():
        d = param.default
        if d is not inspect.Parameter.empty:  # (of one type: `processes=1` is no coalesce.processes=True)
            assert not [v for v in defaults.get(name, []) if type(v) is type(d) and v == d], (part.__name__, name, d)


def test_the_parts_are_built_from_the_settings() -> None:
    s = router_settings(prefix_ttl_s=60.0, index_max_tokens=4096, max_retries=3,
                        kv_events={"max_blocks": 5000, "max_blocks_per_medium": 2048, "replay_timeout_s": 1.5,
                                   "max_batches_per_s": 7, "max_message_bytes": 1 << 17, "anchor_max_chars": 4096},
                        coalesce={"enabled": False, "min_tokens": 9, "max_wait_s": 0.5})
    st = stream_settings(s)
    assert (st.max_blocks, st.max_blocks_per_medium, st.replay_timeout_s, st.max_batches_per_s,
            st.max_message_bytes) == (5000, 2048, 1.5, 7, 1 << 17)
    co = coalesce_config(s)
    assert (co.enabled, co.min_tokens, co.max_wait_s) == (False, 9, 0.5)
    ix = prefix_index(s)
    assert (ix.ttl_s, ix.max_blocks) == (60.0, 4096 * 4 // 64)  # tokens at 4 characters a token, 64 a block
    kv = kv_routing(RouterConfig(settings=s))
    assert kv.enabled and kv.settings == st and kv.anchoring.anchor_max_chars == 4096
    assert kv.chars_per_token() == CHARS_PER_TOKEN
    assert not kv_routing(RouterConfig(settings=router_settings(s, policy="round_robin"))).enabled
    cb = circuit_breaker(router_settings(cb_failures=7, cb_successes=4, cb_open_s=3.5))
    assert (cb.failure_threshold, cb.success_threshold, cb.open_s) == (7, 4, 3.5)
    floor = pair_floor(router_settings(pair_health={"min_kv_speed_gb_s": 2.5, "max_kv_latency_ms": 40.0,
                                                    "bad_samples": 5, "max_transfer_failures": 6,
                                                    "probe_after_s": 9.0}))
    assert floor == PairFloor(min_speed_gb_s=2.5, max_latency_ms=40.0, bad_samples=5, max_failures=6, probe_after_s=9.0)
    reg = prefix_registry(router_settings(rewarm_idle_s=77.0, pin_touch_s=3.0))
    assert (reg.rewarm_idle_s, reg.shared_placement, reg.pin_touch_s) == (77.0, False, 3.0)
    reg = prefix_registry(router_settings(pin_via="priority", state_store="redis://h:6379/0"))
    assert (reg.shared_placement, reg.pin_touch_s) == (True, None)


def test_run_time_forms_take_their_defaults_from_the_model() -> None:
    """A named prefix resolved (PrefixSpec) and the admin client without a profile default as the profile does."""
    spec = PrefixSpec("p", "text")
    named = NamedPrefix(name="p", text="text")
    assert (spec.ttl_s, spec.replicas, spec.pin, spec.fmt, spec.keep) == (named.ttl_s, named.replicas, named.pin,
                                                                          named.format, named.keep)
    assert inspect.signature(AdminClient).parameters["token_env"].default == RouterSettings().admin_token_env


def test_policy_names_are_the_settings_names() -> None:
    assert set(POLICIES) == set(typing.get_args(RouterSettings.model_fields["policy"].annotation))
    assert set(MISS_PLACEMENTS) == set(typing.get_args(RouterSettings.model_fields["miss_placement"].annotation))


def test_serve_flags_default_to_the_settings() -> None:
    """Every `router serve` option but --log-level (logging, not a router setting) defaults to None
    ("take the profile's"), and none carries a bound of its own (the model's apply)."""
    from infer_ctl.cli.router_cmd import serve

    for name, param in inspect.signature(serve).parameters.items():
        if name == "log_level":
            continue
        assert param.default is None, (name, param.default)
        option = typing.get_args(param.annotation)[1] if typing.get_origin(param.annotation) is typing.Annotated else None
        if name != "processes" and option is not None:  # --processes: how many processes, not a setting
            assert getattr(option, "min", None) is None and getattr(option, "max", None) is None, name


@pytest.mark.parametrize(("overrides", "field"), [
    ({"max_retries": 11}, "router.max_retries"),  # the table had no upper bound, the profile le=10
    ({"index_max_tokens": 1}, "router.index_max_tokens"),  # the table had 1, the profile ge=1024
    ({"health_timeout_s": math.nan}, "router.health_timeout_s"),
    ({"kv_events": {"max_blocks": 10}}, "router.kv_events.max_blocks"),
    ({"coalesce": {"max_wait_s": math.inf}}, "router.coalesce.max_wait_s"),
    ({"pair_health": {"bad_samples": 0}}, "router.pair_health.bad_samples"),
    ({"tiers": {"mode": "tiered"}}, "router.tiers.mode"),
    ({"policy": "fastest"}, "router.policy"),
    ({"cb_successes": "2"}, "router.cb_successes"),  # a string set in code is not read as a number
])
def test_an_embedding_override_out_of_bounds_is_refused_by_name(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(UsageError) as info:
        router_config(workers=["http://127.0.0.1:9"], **overrides)
    assert info.value.message.startswith(f"{field}: "), info.value.message


def test_overrides_merge_into_the_group_and_leave_the_rest() -> None:
    base = router_settings(kv_events={"max_blocks": 5000})
    cfg = router_config(workers=["http://127.0.0.1:9"], settings=base, kv_events={"enabled": False},
                        max_retries=0, admin_token="t")
    assert (cfg.settings.kv_events.enabled, cfg.settings.kv_events.max_blocks) == (False, 5000)
    assert cfg.settings.max_retries == 0 and cfg.admin_token == "t"
    with pytest.raises(TypeError, match="kv_max_blocks"):
        router_config(workers=["http://127.0.0.1:9"], kv_max_blocks=5000)  # the old flat name


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--balance-abs", "-1", "router.balance_abs"),
    ("--kv-max-blocks", "5", "router.kv_events.max_blocks"),
    ("--kv-max-batches-per-s", "0", "router.kv_events.max_batches_per_s"),
    ("--policy", "fastest", "router.policy"),
])
def test_a_flag_out_of_bounds_is_refused_by_name(flag: str, value: str, field: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["router", "serve", "--mixed", "http://127.0.0.1:9", flag, value]) == 64
    err = capsys.readouterr().err
    assert f"{field}: " in err and flag in err, err
