"""Issue 28's "Done when" for the KV index: replay on restart, a flooding publisher, a huge prompt.

Three scenarios, each with the router in a child process and the simulated workers in another, so
that neither this process's publishers, probes and RSS readings nor the workers share its GIL:

- `replay`: 4 publishers (tests/router/kv_publisher.py, the wire of SGLang 0.5.23's ZmqEventPublisher)
  each holding `--batches` buffered batches (a 10-block chain each); the router is started `--restarts`
  times against them; each time, the seconds until every stream is exact and holds every block.
- `flood`: one publisher sends ~7.2 MB BlockStored batches (800,000 fresh 63-bit hashes over 4 media)
  every `--interval` s (2 a second: just under the 16 MiB/s flood limit) for `--seconds`; /health is
  probed every 20 ms meanwhile and the router process's RSS sampled. `--per-medium N` sets
  kv_events.max_blocks_per_medium.
- `prompt`: a `--mb` MB prompt posted with KV events on (a simulated PD pair publishing them), /health
  probed meanwhile; `--no-kv`: the same without KV events (the baseline).

Run: `PYTHONPATH=$PWD python scripts/bench_kv_replay.py replay|flood|prompt [options]`. Prints one JSON
line per scenario run, with the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MEDIA = ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")


# ---- the children: simulated workers, and a router ------------------------------------------------
def _sim(conn: Any, n_prefill: int, kv_sim: bool) -> None:
    """The simulated workers in a process of their own (the router's GIL is not theirs: a simulated
    prefill tokenizing a 29 MB prompt held it ~1 s when they shared a process)."""
    from infer_ctl.sim.cluster import start_cluster_in_thread
    from tests.router.conftest import pd_specs
    from tests.sim.kv_client import kv_config

    specs = pd_specs(n_prefill, 1)
    if kv_sim:
        for s in specs:
            if s.role == "prefill":
                s.kv_events_config = kv_config()
    c = start_cluster_in_thread(specs)
    conn.send(([(w.url, w.bootstrap_port) for w in c.workers if w.spec.role == "prefill"],
               [w.url for w in c.workers if w.spec.role == "decode"]))
    conn.recv()
    c.stop()


def _child(conn: Any, pre: list[tuple[str, int]], dec: list[str], pubs: list[tuple[int, int | None]],
           per_medium: int | None) -> None:
    import asyncio

    from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

    extra = {} if per_medium is None else {"kv_max_blocks_per_medium": per_medium}
    h = start_router_in_thread(router_config(prefill=pre, decode=dec, health_interval_s=3600 if pubs else 1.0,
                                             **extra))
    router = h.server.router
    time.sleep(1.5)  # the first health check: it sets each prefill's own (descriptor-less) stream

    async def inject() -> None:
        for (url, _), (port, rport) in zip(pre, pubs, strict=False):
            router.kv.configure(url, {"page_size": 1, "kv_events": {
                "endpoint_host": "*", "endpoint_port_base": port, "replay_endpoint_port_base": rport,
                "topic": "", "block_size": 1}})

    t0 = time.monotonic()
    if pubs:
        asyncio.run_coroutine_threadsafe(inject(), h.loop).result(10)
    conn.send({"url": h.url, "pid": os.getpid(), "t0": t0})
    while True:
        cmd = conn.recv()
        if cmd == "stop":
            break
        streams = []
        for url, _ in pre[: len(pubs)] if pubs else pre:
            w = router.kv.workers.get(url)
            for s in (w.streams if w else []):
                streams.append({"state": s.state, "blocks": len(s.blocks), "seq": s.last_seq,
                                "reason": s.reason, "media": s.blocks.snapshot(),
                                "rejected": dict(s.stats.rejected)})
        conn.send({"t": time.monotonic(), "streams": streams})
    h.stop()
    conn.send("stopped")


class _Run:
    """The simulated workers' process and the router's."""

    def __init__(self, n_prefill: int, pubs: list[tuple[int, int | None]], kv_sim: bool = False,
                 per_medium: int | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.sim_conn, b = ctx.Pipe()
        self.sim = ctx.Process(target=_sim, args=(b, n_prefill, kv_sim), daemon=True)
        self.sim.start()
        if not self.sim_conn.poll(120):
            raise SystemExit("simulated workers did not start")
        pre, dec = self.sim_conn.recv()
        self.conn, b = ctx.Pipe()
        self.p = ctx.Process(target=_child, args=(b, pre, dec, pubs, per_medium), daemon=True)
        self.p.start()
        if not self.conn.poll(120):
            raise SystemExit("router child did not start")
        self.hello: dict[str, Any] = self.conn.recv()

    def state(self) -> dict[str, Any]:
        self.conn.send("state")
        out: dict[str, Any] = self.conn.recv()
        return out

    def stop(self) -> None:
        self.conn.send("stop")
        self.conn.poll(30)
        self.sim_conn.send("stop")
        for p in (self.p, self.sim):
            p.join(30)
            if p.is_alive():
                p.kill()


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _q(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"n": len(xs), "p50_ms": round(statistics.median(xs) * 1000, 1),
            "p99_ms": round(xs[max(0, int(len(xs) * 0.99) - 1)] * 1000, 1), "max_ms": round(xs[-1] * 1000, 1)}


class _Probe:
    """GET /health every 20 ms on its own thread: the latencies."""

    def __init__(self, url: str) -> None:
        import httpx

        self.cl = httpx.Client(timeout=30)
        self.url = url + "/health"
        self.lat: list[float] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            self.cl.get(self.url)
            self.lat.append(time.perf_counter() - t)
            time.sleep(0.02)

    def __enter__(self) -> _Probe:
        self.t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.t.join()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


# ---- scenarios ----------------------------------------------------------------------------------
def replay(args: argparse.Namespace) -> None:
    from tests.router.kv_publisher import CLEARED, TestPublisher, stored

    pubs = [TestPublisher() for _ in range(4)]
    rng = random.Random(7)
    want = []
    for pub in pubs:
        pub.batch([CLEARED], send=False)
        held = 0
        for _ in range(args.batches - 1):
            hs = [rng.getrandbits(63) for _ in range(10)]
            pub.batch([stored(hs, None, list(range(10)))], send=False)
            held += 10
        want.append(held)
    results = []
    for i in range(args.restarts):
        run = _Run(4, [(pub.port, pub.replay_port) for pub in pubs])
        hello = run.hello
        exact_at = None
        last: dict[str, Any] = {}
        while True:
            last = run.state()
            ok = [s["state"] == "exact" and s["blocks"] == w for s, w in zip(last["streams"], want, strict=True)]
            if all(ok) and len(ok) == 4:
                exact_at = last["t"] - hello["t0"]
                break
            if last["t"] - hello["t0"] > args.limit_s:
                break
            time.sleep(0.05)
        results.append(round(exact_at, 2) if exact_at is not None else None)
        if exact_at is None:
            print(json.dumps({"restart": i, "not_exact": last["streams"]}), flush=True)
        run.stop()
    for pub in pubs:
        pub.close()
    exact = [r for r in results if r is not None and r <= 10]
    print(json.dumps({"scenario": "replay", "batches_per_worker": args.batches, "restarts": args.restarts,
                      "seconds_to_exact": results, "exact_within_10s": f"{len(exact)} of {len(results)}",
                      "loadavg": _load()}), flush=True)


def _flood_payload(rng: random.Random, n: int) -> bytes:
    import msgspec

    per = n // len(MEDIA)
    events = [{"type": "BlockStored", "block_hashes": [rng.getrandbits(63) for _ in range(per)],
               "parent_block_hash": None, "token_ids": [], "block_size": 1, "medium": m} for m in MEDIA]
    return msgspec.msgpack.encode([time.time(), events, 0])


def flood(args: argparse.Namespace) -> None:
    from tests.router.kv_publisher import CLEARED, TestPublisher

    pub = TestPublisher()
    pub.batch([CLEARED], send=False)
    run = _Run(1, [(pub.port, pub.replay_port)], per_medium=args.per_medium)
    hello = run.hello
    for _ in range(200):  # until the subscription landed and the replay is done
        st = run.state()["streams"]
        if st and st[0]["state"] == "exact":
            break
        time.sleep(0.05)
    rng = random.Random(3)
    payloads = [_flood_payload(rng, args.hashes) for _ in range(4)]  # fresh hashes for 4 batches, then reused
    rss0 = _rss_mb(hello["pid"])
    with _Probe(hello["url"]) as base:
        time.sleep(3)
    rss_peak = rss0
    stop = threading.Event()

    def send() -> None:
        i = 0
        while not stop.is_set():
            with pub._lock:
                s = pub.seq
                pub.seq += 1
            pub.raw([b"", s.to_bytes(8, "big"), payloads[i % len(payloads)]])
            i += 1
            time.sleep(args.interval)

    t = threading.Thread(target=send, daemon=True)
    with _Probe(hello["url"]) as during:
        t.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            rss_peak = max(rss_peak, _rss_mb(hello["pid"]))
            time.sleep(0.2)
        stop.set()
        t.join()
    st = run.state()["streams"]
    run.stop()
    pub.close()
    print(json.dumps({"scenario": "flood", "batch_bytes": len(payloads[0]), "interval_s": args.interval,
                      "seconds": args.seconds, "max_blocks_per_medium": args.per_medium,
                      "health_before": _q(base.lat), "health_during": _q(during.lat),
                      "rss_mb_before": round(rss0), "rss_mb_peak": round(rss_peak),
                      "stream_after": st[0] if st else None, "loadavg": _load()}), flush=True)


def prompt(args: argparse.Namespace) -> None:
    import httpx

    run = _Run(1, [], kv_sim=not args.no_kv)
    hello = run.hello
    time.sleep(2)  # the subscription and its replay
    st = run.state()["streams"]
    text = ("lorem ipsum dolor sit amet " * (args.mb * (1 << 20) // 27 + 1))[: args.mb * (1 << 20)]
    with _Probe(hello["url"]) as base:
        time.sleep(2)
    status: list[int] = []

    def post() -> None:
        r = httpx.post(hello["url"] + "/generate", timeout=300,
                       json={"text": text, "sampling_params": {"max_new_tokens": 1}})
        status.append(r.status_code)

    t = threading.Thread(target=post)
    with _Probe(hello["url"]) as during:
        t0 = time.monotonic()
        t.start()
        t.join()
        took = time.monotonic() - t0
        time.sleep(1)
    run.stop()
    print(json.dumps({"scenario": "prompt", "mb": args.mb, "kv_events": not args.no_kv, "status": status, "request_s": round(took, 2),
                      "kv_stream_before": st[0]["state"] if st else None,
                      "health_before": _q(base.lat), "health_during": _q(during.lat),
                      "loadavg": _load()}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="scenario", required=True)
    r = sub.add_parser("replay")
    r.add_argument("--batches", type=int, default=10_000)
    r.add_argument("--restarts", type=int, default=5)
    r.add_argument("--limit-s", type=float, default=60.0)
    f = sub.add_parser("flood")
    f.add_argument("--hashes", type=int, default=800_000)
    f.add_argument("--interval", type=float, default=0.5)
    f.add_argument("--seconds", type=float, default=20.0)
    f.add_argument("--per-medium", type=int, default=None)
    pr = sub.add_parser("prompt")
    pr.add_argument("--mb", type=int, default=29)
    pr.add_argument("--no-kv", action="store_true", help="the prefill publishes no KV events (the baseline)")
    args = ap.parse_args()
    {"replay": replay, "flood": flood, "prompt": prompt}[args.scenario](args)


if __name__ == "__main__":
    main()
