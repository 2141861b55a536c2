"""A worker that is down is probed every second between health rounds (router/control/health.py DOWN_PROBE_S):
restarted, it takes traffic again within a second of answering, not a health interval later."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.kv_publisher import TestPublisher
from tests.router.standin_http import StandinServer
from tests.waiting import wait_for


def take_down(router: RouterHandle, cluster: ThreadedSimCluster, i: int, workers: int) -> Any:
    """Stop simulated worker `i` and have the router see it down: round robin over `workers`, one of
    as many requests meets the dead worker (retried), and its check marks it (health_failures=1)."""
    w = router.router.workers.by_url[cluster.urls[i]]
    cluster.stop_worker(i)
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}
    for _ in range(workers):
        assert httpx.post(router.url + "/generate", json=body, timeout=10).status_code == 200
    assert wait_for(lambda: not w.healthy, timeout=5)
    return w


def test_a_restarted_worker_is_back_within_a_second_not_a_health_interval() -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.1, speculative=False) for _ in range(2)])
    router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=30.0, health_failures=1,
                                                  policy="round_robin", retry_base_s=0.01))
    try:
        w = take_down(router, cluster, 1, 4)
        cluster.start_worker(1)  # back on the same port
        t0 = time.monotonic()
        assert wait_for(lambda: w.healthy, timeout=5)
        assert time.monotonic() - t0 < 3.0
    finally:
        router.stop()
        cluster.stop()


class Silent:
    """A hung worker: accepts connections and never answers. Counts them; `open()` says how many the
    router still holds open."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setblocking(False)
            self.conns.append(conn)

    def open(self) -> int:
        n = 0
        for c in self.conns:
            try:
                while c.recv(65536):  # the request; b"" once the router closed it
                    pass
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def test_a_hung_worker_holds_up_no_other_workers_probe() -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.1, speculative=False) for _ in range(2)])
    hung = Silent()
    router = None
    try:
        router = start_router_in_thread(router_config(
            workers=[*cluster.urls, hung.url], health_interval_s=60.0, health_timeout_s=4.0, health_failures=1,
            policy="round_robin", retry_base_s=0.01))
        h = router.router.workers.by_url[hung.url]
        assert wait_for(lambda: not h.healthy, timeout=10)  # the first round timed out on it
        w = take_down(router, cluster, 1, 3)
        # a probe of the hung worker just began (and one of the dead one with it)
        n = len(hung.conns)
        assert wait_for(lambda: len(hung.conns) > n, timeout=5)
        cluster.start_worker(1)
        t0 = time.monotonic()
        # probed together and waited for as one, the next probe of either came after the hung one's
        # health_timeout_s: back 5 s later
        assert wait_for(lambda: w.healthy, timeout=8)
        assert time.monotonic() - t0 < 2.5
        # one probe at a time against the hung worker, and none left open once it timed out
        assert hung.open() <= 1
        # shutting down with a probe in flight against it: at once, not after its timeout
        t0 = time.monotonic()
        router.stop()
        assert time.monotonic() - t0 < 3.0
    finally:
        if router is not None:
            router.stop()
        hung.close()
        cluster.stop()


class SlowInfo:
    """A worker whose /server_info (advertising KV events) answers only once `release` is set; counts
    the /server_info requests."""

    def __init__(self, pub: TestPublisher) -> None:
        info = {"page_size": 1, "startup_time": 1.0, "version": "0.5.23",
                "kv_events": {"publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": pub.port, "topic": "",
                              "block_size": 1, "dp_size": 1, "replay_endpoint_port_base": pub.replay_port}}
        body = json.dumps(info).encode()
        self.release = threading.Event()
        self.release.set()
        self.asked = 0
        self.body = body
        self.server = StandinServer(self._answer)
        self.url = self.server.url

    def _answer(self, path: str) -> tuple[int, bytes]:
        if path != "/server_info":
            return 200, b"{}"
        self.asked += 1
        self.release.wait(20)
        return 200, self.body

    def close(self) -> None:
        self.release.set()
        self.server.close()


def test_a_worker_removed_while_its_check_is_in_flight_is_not_subscribed_again() -> None:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.1, speculative=False)])
    pub = TestPublisher()
    slow = SlowInfo(pub)
    router = None
    try:
        router = start_router_in_thread(router_config(workers=[cluster.urls[0], slow.url], health_interval_s=0.2))
        kv = router.router.kv
        assert wait_for(lambda: slow.url in kv.workers, timeout=10)
        slow.release.clear()
        n = slow.asked
        assert wait_for(lambda: slow.asked > n, timeout=10)  # a check waits for its /server_info now
        r = httpx.post(router.url + "/admin/workers/remove", json={"url": slow.url}, timeout=5)
        assert r.status_code == 200 and slow.url not in kv.workers
        slow.release.set()
        checking = router.server.health._checking
        assert wait_for(lambda: slow.url not in checking, timeout=10)
        # the answer came for a worker no longer there: nothing of it taken up again
        assert slow.url not in kv.workers
        assert slow.url not in router.router.workers.by_url
    finally:
        if router is not None:
            router.stop()
        slow.close()
        pub.close()
        cluster.stop()
