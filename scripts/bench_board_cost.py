"""CPU of the flight board (router/fleet/shared_flights.py) per request, in one Python process.

A reader process's look at the board (`sync`, then `materialize` for its own decision's chain on two
candidate workers) while N-1 other processes each land and free their oldest flight and publish a new
one per reader request (equal request rates), F flights in flight over all processes, chains of B blocks
sharing tenants' first blocks. Also: one process's own publish + land + free, and a look when nothing
changed. Results in docs/benchmarks.md ("In-flight prompts shared between the router's processes").

    python scripts/bench_board_cost.py
"""

from __future__ import annotations

import random
import statistics
import time
from collections import deque

from infer_ctl.core.routing.coalesce import Flight, PendingBlocks
from infer_ctl.core.routing.index import block_hashes
from infer_ctl.router.fleet import shared_flights as sf
from infer_ctl.router.fleet.shared_load import SharedLoad

URLS = [f"http://w{i}" for i in range(8)]


def _ignore(flight: Flight, state: str) -> None:
    pass


def bench(processes: int, inflight: int, blocks: int, ticks: int = 3000) -> tuple[float, float, float]:
    """(own publish+land+free µs, one look per request µs, a look with nothing changed µs), medians."""
    blk = SharedLoad.create(processes, 72, extra=sf.ROW_CELLS)
    boards = [sf.FlightBoard(blk.cells, blk.extra_offset, processes, i,
                             lambda s: URLS[s] if s < len(URLS) else None, URLS.index) for i in range(processes)]
    rng = random.Random(1)
    systems = [block_hashes(f"tenant {t} " * (64 * blocks // 9 + 9), 64)[:blocks] for t in range(20)]

    def new() -> Flight:  # a tenant's system prompt, then a question of its own
        return Flight(rng.choice(URLS), [*rng.choice(systems)[:blocks - 2], rng.getrandbits(62), rng.getrandbits(62)])

    live: list[deque[Flight]] = [deque() for _ in range(processes)]
    for p in range(1, processes):
        for _ in range(max(1, inflight // processes)):
            f = new()
            boards[p].publish(f, 0)
            live[p].append(f)
    pending = PendingBlocks()
    me = boards[0]
    me.sync(pending, _ignore, lambda f: "worker", "client")
    writes, looks = [], []
    for _ in range(ticks):
        t0 = time.perf_counter()
        for p in range(1, processes):
            old = live[p].popleft()
            boards[p].state(old, sf.LANDED)
            boards[p].free(old)
            f = new()
            boards[p].publish(f, 0)
            live[p].append(f)
        own = rng.choice(systems)
        t1 = time.perf_counter()
        me.sync(pending, _ignore, lambda f: "worker", "client")
        for url in URLS[:2]:  # a decision here: its chain on two candidate workers
            me.materialize(pending, url, own)
        t2 = time.perf_counter()
        writes.append((t1 - t0) / (processes - 1))
        looks.append(t2 - t1)
    t0 = time.perf_counter()
    for _ in range(ticks):
        me.sync(pending, _ignore, lambda f: "worker", "client")
    idle = (time.perf_counter() - t0) / ticks
    for b in boards:
        b.close()
    blk.close()
    return statistics.median(writes) * 1e6, statistics.median(looks) * 1e6, idle * 1e6


def main() -> None:
    for processes in (2, 8):
        for inflight in (20, 100):
            for blocks in (40, 256):
                w, s, i = bench(processes, inflight, blocks)
                print(f"processes={processes} in_flight={inflight:3d} blocks={blocks:3d}: own publish+land+free "
                      f"{w:6.1f} us, one look per request {s:7.1f} us, a look with nothing changed {i:5.2f} us")


if __name__ == "__main__":
    main()
