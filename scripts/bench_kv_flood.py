"""Request latency through the router while one prefill's KV publisher floods it with 15 MB batches.

A simulated 1P+1D cluster behind the router; the prefill's KV-events descriptor is pointed at a publisher
this script controls (tests/router/kv_publisher.py), which sends a 15 MB batch (a BlockRemoved of 15M
one-byte hashes) every 100 ms while sequential /generate requests are timed. Prints p50/p99/max before
and during the flood and the stream's state. Run: `PYTHONPATH=$PWD python scripts/bench_kv_flood.py`.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import start_cluster_in_thread
from tests.router.conftest import pd_specs
from tests.router.kv_publisher import CLEARED, TestPublisher


def bomb(n: int) -> bytes:
    return (b"\x93\xcb" + b"\0" * 8 + b"\x91" + b"\x83\xa4type\xacBlockRemoved\xacblock_hashes\xdd" + n.to_bytes(4, "big")
            + b"\x01" * n + b"\xa6medium\xa3GPU" + b"\x00")


def q(xs: list[float]) -> str:
    xs = sorted(xs)
    return (f"p50 {statistics.median(xs) * 1000:.1f} ms, p99 {xs[int(len(xs) * 0.99) - 1] * 1000:.1f} ms, "
            f"max {xs[-1] * 1000:.1f} ms")


def main() -> None:
    c = start_cluster_in_thread(pd_specs(1, 1))
    pre = [(w.url, w.bootstrap_port) for w in c.workers if w.spec.role == "prefill"]
    dec = [w.url for w in c.workers if w.spec.role == "decode"]
    h = start_router_in_thread(router_config(prefill=pre, decode=dec, health_interval_s=3600))
    time.sleep(1.5)  # the first health check (it forgets the simulated prefill's descriptor-less stream)
    pub = TestPublisher()
    pub.batch([CLEARED])

    async def inject() -> None:
        h.server.router.kv.configure(pre[0][0], {"page_size": 1, "kv_events": {
            "endpoint_host": "*", "endpoint_port_base": pub.port, "replay_endpoint_port_base": pub.replay_port,
            "topic": "", "block_size": 1}})

    asyncio.run_coroutine_threadsafe(inject(), h.loop).result(5)
    st = h.server.router.kv.workers[pre[0][0]].streams[0]
    for _ in range(200):  # until the subscription landed (ZMQ's slow joiner)
        pub.batch([])
        time.sleep(0.02)
        if st.stats.batches > 1:
            break
    cl = httpx.Client(timeout=30)
    body = {"text": "hello world", "sampling_params": {"max_new_tokens": 1}}

    def measure(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            assert cl.post(h.url + "/generate", json=body).status_code == 200
            out.append(time.perf_counter() - t)
        return out

    measure(5)
    base = measure(60)
    payload, stop = bomb(15_000_000), threading.Event()

    def flood() -> None:
        time.sleep(0.3)  # the measurement is running
        i = pub.seq
        while not stop.is_set():
            pub.raw([b"", i.to_bytes(8, "big"), payload])
            i += 1
            time.sleep(0.1)

    t = threading.Thread(target=flood)
    t.start()
    during = measure(400)
    stop.set()
    t.join()
    print("baseline:", q(base))
    print("flooding:", q(during))
    print("stream:", st.state, st.reason, st.stats.rejected, "gaps", st.stats.gaps)
    h.stop()
    c.stop()
    pub.close()


if __name__ == "__main__":
    main()
