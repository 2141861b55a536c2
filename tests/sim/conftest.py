"""A real simulated cluster on loopback (real aiohttp servers, real HTTP); free ports picked by the OS."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread

FAST = 0.02  # wall seconds per model second: tests run 50x faster than the modelled H100/H200


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    specs = [
        WorkerSpec("mixed", time_scale=FAST, cache_capacity_tokens=4096),
        WorkerSpec("prefill", time_scale=FAST, bootstrap_timeout_s=1.0),
        WorkerSpec("decode", time_scale=FAST, waiting_timeout_s=1.0),
        WorkerSpec("prefill", time_scale=FAST, bootstrap_timeout_s=1.0),
    ]
    c = start_cluster_in_thread(specs)
    yield c
    c.stop()
