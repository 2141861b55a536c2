"""Fixtures: real simulated SGLang workers (infer_ctl.sim, real HTTP + PD bootstrap on loopback) with the
real router in front, each on its own event loop thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

#: wall seconds per modelled second: the simulated 70B runs 20x faster than on H100s
TIME_SCALE = 0.05


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
