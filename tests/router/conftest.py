"""Fixtures: real simulated SGLang workers (infer_ctl.sim, real HTTP + PD bootstrap on loopback) with the
real router in front, each on its own event loop thread."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from infer_ctl.core.routing.blocks import WorkerBlocks
from infer_ctl.core.routing.breaker import CircuitBreaker
from infer_ctl.core.routing.coalesce import CoalesceConfig
from infer_ctl.core.routing.index import BLOCK_CHARS, PrefixIndex
from infer_ctl.core.routing.pair_health import PairFloor
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.router.config import (
    RouterConfig,
    circuit_breaker,
    coalesce_config,
    kv_routing,
    pair_floor,
    prefix_index,
    prefix_registry,
    router_settings,
    stream_settings,
)
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.kvindex.kv_subscriber import StreamSettings
from infer_ctl.router.kvindex.replay_cursor import ReplayCursor
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

#: wall seconds per modelled second: the simulated 70B runs 20x faster than on H100s
TIME_SCALE = 0.05


# The router's parts as the router builds them (router/config.py), from RouterSettings' defaults with
# `settings` overrides (router_settings: the profile's bounds) and then the part's own keywords: a test
# names only the numbers it is about, never a setting's default (issue 27: one declaration of each).


def new_prefix_index(block_chars: int = BLOCK_CHARS, settings: dict[str, Any] | None = None,
                     **kw: Any) -> PrefixIndex:
    base = prefix_index(router_settings(**(settings or {})), block_chars=block_chars)
    return PrefixIndex(**{"ttl_s": base.ttl_s, "max_blocks": base.max_blocks, "block_chars": block_chars, **kw})


def new_stream_settings(settings: dict[str, Any] | None = None, **kw: Any) -> StreamSettings:
    return dataclasses.replace(stream_settings(router_settings(**(settings or {}))), **kw)


def new_worker_blocks(settings: dict[str, Any] | None = None, **kw: Any) -> WorkerBlocks:
    s = stream_settings(router_settings(**(settings or {})))
    return WorkerBlocks(**{"max_blocks": s.max_blocks, "max_blocks_per_medium": s.max_blocks_per_medium, **kw})


def new_coalesce_config(settings: dict[str, Any] | None = None, **kw: Any) -> CoalesceConfig:
    return dataclasses.replace(coalesce_config(router_settings(**(settings or {}))), **kw)


def new_replay_cursor(start: int, last: int | None, settings: dict[str, Any] | None = None,
                      **kw: Any) -> ReplayCursor:
    s = stream_settings(router_settings(**(settings or {})))
    return ReplayCursor(start, last, **{"timeout_s": s.replay_timeout_s, **kw})


def new_breaker(settings: dict[str, Any] | None = None, **kw: Any) -> CircuitBreaker:
    return dataclasses.replace(circuit_breaker(router_settings(**(settings or {}))), **kw)


def new_pair_floor(settings: dict[str, Any] | None = None, **kw: Any) -> PairFloor:
    return dataclasses.replace(pair_floor(router_settings(**(settings or {}))), **kw)


def new_prefix_registry(settings: dict[str, Any] | None = None, **kw: Any) -> PrefixRegistry:
    """kw: PrefixRegistry's own keywords (rewarm_idle_s, pin_touch_s, ...) over the built one's."""
    built = prefix_registry(router_settings(**(settings or {})))
    return PrefixRegistry(**{"rewarm_idle_s": built.rewarm_idle_s, "shared_placement": built.shared_placement,
                             "pin_touch_s": built.pin_touch_s, **kw})


def new_spec_stats(settings: dict[str, Any] | None = None, **kw: Any) -> SpecStats:
    cfg = RouterConfig(settings=router_settings(**(settings or {})))
    return SpecStats(**{"window": cfg.spec_window_requests, "max_labels": cfg.settings.spec_max_labels, **kw})


def new_kv_routing(settings: dict[str, Any] | None = None, **kw: Any) -> KvRouting:
    """kw: KvRouting's own keywords (enabled, tokenizer_path, processes, ...) over the built one's."""
    built = kv_routing(RouterConfig(settings=router_settings(**(settings or {}))))
    return KvRouting(**{"enabled": built.enabled, "settings": built.settings, "tier_weights": built.tier_weights,
                        "anchor_max_chars": built.anchoring.anchor_max_chars,
                        "tokenizer_path": built.tokenizer_path, **kw})


def pd_specs(n_prefill: int = 2, n_decode: int = 2, **kw: Any) -> list[WorkerSpec]:
    kw.setdefault("time_scale", TIME_SCALE)
    kw.setdefault("bootstrap_timeout_s", 10.0)
    kw.setdefault("waiting_timeout_s", 10.0)
    return [WorkerSpec("prefill", **kw) for _ in range(n_prefill)] + [WorkerSpec("decode", **kw) for _ in range(n_decode)]


def pd_router(cluster: ThreadedSimCluster, **overrides: Any) -> RouterHandle:
    pre = [(w.url, w.bootstrap_port) for w in cluster.workers if w.spec.role == "prefill"]
    dec = [w.url for w in cluster.workers if w.spec.role == "decode"]
    overrides.setdefault("health_interval_s", 0.5)
    overrides.setdefault("warm_via", "pair")
    return start_router_in_thread(router_config(prefill=pre, decode=dec, **overrides))


@pytest.fixture(scope="module")
def pd_cluster() -> Iterator[ThreadedSimCluster]:
    cluster = start_cluster_in_thread(pd_specs())
    yield cluster
    cluster.stop()


@pytest.fixture
def router(pd_cluster: ThreadedSimCluster) -> Iterator[RouterHandle]:
    handle = pd_router(pd_cluster)
    yield handle
    handle.stop()
