"""In-flight prefix coalescing across router processes (router/fleet/shared_flights.py, router/request/coalesce.py).

Two routers in this test process stand for two processes of one `router serve --processes 2`: they share
one shared-memory block (load and flight board) exactly as the supervisor's processes do, over the same
simulated workers publishing KV events. A request computing a new prefix through one of them makes a
request of the same prefix through the other go to its worker and wait for it (before the board, each
process knew only its own flights: the follower was placed by load and computed the prefix again);
when the leader's client goes away, the follower takes over and computes it. The end-to-end run of the
real supervisor is in scaleout/test_processes.py."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from infer_ctl.router.daemon.assembly import Seat
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.router.fleet import shared_flights
from infer_ctl.router.fleet.shared_load import SharedLoad
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.request.test_coalesce_leader_faults import raw_stream_request
from tests.router.request.test_coalesce_router import WORDS, meta, metric
from tests.sim.kv_client import kv_config
from tests.waiting import wait_for

#: about a second to prefill the shared prompt at time scale 1: the follower arrives while it computes
SLOW = {"time_scale": 1.0, "speculative": False, "prefill_mfu": 0.01, "bootstrap_timeout_s": 10.0,
        "waiting_timeout_s": 10.0}


def shared_routers(cluster: ThreadedSimCluster, n: int = 2) -> tuple[list[RouterHandle], SharedLoad]:
    """Routers built as the processes of several are (router/daemon/assembly.py `build`): each
    with its row of one shared block (load rows, then the board)."""
    block = SharedLoad.create(n, 8, extra=shared_flights.ROW_CELLS)
    routers = [start_router_in_thread(router_config(workers=[w.url for w in cluster.workers],
                                                    health_interval_s=0.3, coalesce={"max_wait_s": 8.0},
                                                    log_requests=True),
                                      seat=Seat(block, i, n)) for i in range(n)]
    return routers, block


@pytest.fixture
def pair() -> Iterator[tuple[ThreadedSimCluster, list[RouterHandle]]]:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", kv_events_config=kv_config(), **SLOW) for _ in range(2)])
    routers, block = shared_routers(cluster)
    try:
        for r in routers:
            assert wait_for(lambda r=r: all(w["index"] == "exact" for w in httpx.get(
                r.url + "/admin/workers", timeout=5).json()["workers"]))
        yield cluster, routers
    finally:
        for r in routers:
            r.stop(drain=False)
        for r in routers:
            for w in r.router.workers.all():
                w.shared = None
        block.close()
        cluster.stop()


def body(system: str, name: str, stream: bool) -> dict[str, Any]:
    return {"text": f"{system} question {name}", "stream": stream, "sampling_params": {"max_new_tokens": 1}}


def computing_on(router: RouterHandle) -> str | None:
    busy = [w.url for w in router.router.workers.all() if w.own_inflight]
    return busy[0] if busy else None


def test_a_follower_in_the_other_process_waits_for_the_leaders_prefill_and_hits(
        pair: tuple[ThreadedSimCluster, list[RouterHandle]]) -> None:
    _, (a, b) = pair
    system = " ".join(random.Random(3).choice(WORDS) for _ in range(1000))
    with ThreadPoolExecutor(2) as pool:
        leader = pool.submit(meta, a, body(system, "leader", True))
        assert wait_for(lambda: computing_on(a) is not None, timeout=10)
        where = computing_on(a)
        follower = pool.submit(meta, b, body(system, "follower", False))
        assert wait_for(lambda: b.router.coalesce.holding == 1, timeout=10)
        assert [w.url for w in b.router.workers.all() if w.own_inflight] == [where]  # held on the leader's worker
        m_leader, m_follower = leader.result(30), follower.result(30)
    assert m_leader["cached_tokens"] < 0.5 * m_leader["prompt_tokens"]
    assert m_follower["cached_tokens"] >= 0.9 * m_follower["prompt_tokens"], m_follower
    assert metric(b, 'inferctl_router_coalesce_held_total{reason="landed"}') == 1
    # and the overlays are empty again once both are done and stored (the status looks at the board)

    def coalesce(r: RouterHandle) -> dict[str, Any]:
        return dict(httpx.get(r.url + "/admin/status", timeout=5).json()["coalesce"])

    assert wait_for(lambda: not coalesce(a)["pending_blocks"] and not coalesce(b)["pending_blocks"], timeout=10), \
        json.dumps([coalesce(a), coalesce(b)])
    assert coalesce(b)["board"] == {"published": 0, "mirrored": 0, "unpublished": 0, "foreign_processes": []}


def test_the_leaders_client_gone_in_one_process_promotes_the_follower_held_in_the_other(
        pair: tuple[ThreadedSimCluster, list[RouterHandle]]) -> None:
    _, (a, b) = pair
    system = " ".join(random.Random(4).choice(WORDS) for _ in range(1000))
    sock = raw_stream_request(a.url, body(system, "leader", True))
    try:
        assert wait_for(lambda: computing_on(a) is not None, timeout=10)
        with ThreadPoolExecutor(1) as pool:
            follower = pool.submit(meta, b, body(system, "follower", False))
            assert wait_for(lambda: b.router.coalesce.holding == 1, timeout=10)
            sock.close()  # the leader's user goes away mid-prefill
            m = follower.result(30)
    finally:
        sock.close()
    assert m["prompt_tokens"] > 900
    assert metric(b, 'inferctl_router_coalesce_held_total{reason="promoted"}') == 1
    assert b.router.coalesce.promoted == 1
