"""A busy worker's replay keeps the exact index, over real ZMQ sockets: a hole inside
an answer is asked for again, a replay larger than the live flood limit is not a flood, and the replay
socket has no receive limit (a loop busy while the answer arrives loses nothing)."""

from __future__ import annotations

import asyncio
import time

from tests.router.kv_publisher import CLEARED, TestPublisher, stored
from tests.router.kvindex.test_stream import run, streaming, until


def _buffer(pub: TestPublisher, n: int) -> None:
    """`n` buffered batches after a clear, never sent live (published before the router subscribed)."""
    pub.batch([CLEARED], send=False)
    for i in range(1, n):
        pub.batch([stored([i], i - 1 if i > 1 else None, [i % 50_000])], send=False)


def test_a_hole_inside_the_replay_is_asked_again_from_the_missing_seq() -> None:
    """Before: "cannot replay from seq 0: the worker's buffer starts at seq 1016, after 1000", untrusted."""
    async def main() -> None:
        pub = TestPublisher()
        _buffer(pub, 1200)
        pub.hole_once = set(range(1000, 1016))
        async with streaming(pub, connect=False) as (s, seen, _):
            assert await until(lambda: s.exact, 20), s.as_dict()
            assert s.last_seq == 1199 and s.blocks.holds(1199) and len(s.blocks) == 1199
            assert pub.replay_requests == [0, 1000]
            assert seen["untrusted"] == 0 and s.stats.replay_failures == 0 and s.stats.gaps == 1

    run(main())


def test_a_replay_longer_than_the_live_flood_limit_is_not_a_flood() -> None:
    """Before: a legitimate replay of 6,746 small batches tripped the 5,000 batches/s limit (here scaled
    down: 3,000 batches against a 500/s limit)."""
    async def main() -> None:
        pub = TestPublisher()
        _buffer(pub, 3000)
        async with streaming(pub, connect=False, max_batches_per_s=500) as (s, seen, _):
            assert await until(lambda: s.exact, 20), s.as_dict()
            assert s.last_seq == 2999 and len(s.blocks) == 2999
            assert s.stats.rejected == {} and seen["untrusted"] == 0

    run(main())


def test_a_replay_arriving_while_the_loop_is_busy_loses_nothing() -> None:
    """The replay DEALER had ZMQ's default 1,000-message receive limit: while the event loop was busy
    the publisher's ROUTER dropped what did not fit (a hole, then untrusted). With no receive limit
    the answer waits in the socket (and a hole the publisher's own send limit makes on a starved host is
    asked for again)."""
    async def main() -> None:
        pub = TestPublisher()
        _buffer(pub, 6_000)

        async def busy_when_asked() -> None:
            while not pub.replay_requests:
                await asyncio.sleep(0.001)
            time.sleep(1.0)  # the loop held (a long prompt's tokenizing, a GC): nothing reads the socket

        async with streaming(pub, connect=False) as (s, seen, _):
            blocker = asyncio.ensure_future(busy_when_asked())
            assert await until(lambda: s.exact, 30), s.as_dict()
            await blocker
            assert s.last_seq == 5_999 and len(s.blocks) == 5_999
            assert seen["untrusted"] == 0 and s.stats.replay_failures == 0

    run(main())


def test_a_replay_budget_is_enforced_whole() -> None:
    async def main() -> None:
        pub = TestPublisher()
        _buffer(pub, 300)
        async with streaming(pub, connect=False, replay_max_batches=100) as (s, _, _):
            assert await until(lambda: s.state == "untrusted", 20), s.as_dict()
            assert "more than 100 batches in one replay" in s.reason

    run(main())

