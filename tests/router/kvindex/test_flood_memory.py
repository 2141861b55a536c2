"""A publisher under the flood limits must not stall the router nor hold its memory.

Each storage medium is bounded on its own (`max_blocks_per_medium`, refused blocks counted by medium),
an untrusted stream frees its blocks at once, and a batch is applied in slices with the event loop
running between them (an 800,000-hash set update held a loaded host's loop 0.8-1.6 s)."""

from __future__ import annotations

import asyncio
import random
import time
import tracemalloc
import weakref

import msgspec
import pytest

from infer_ctl.core.routing.blocks import EventRejected
from infer_ctl.router.kvindex.kv_subscriber import KvStream
from tests.router.conftest import new_stream_settings, new_worker_blocks


def stored(hashes: list[int], parent: int | None, medium: str = "GPU") -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": [],
            "block_size": 1, "medium": medium}


def test_each_medium_is_bounded_on_its_own_and_refusals_are_counted_by_medium() -> None:
    b = new_worker_blocks(max_blocks=1000, max_blocks_per_medium=10)
    b.apply([stored(list(range(1, 9)), None), stored(list(range(1, 9)), None, "CPU_PINNED")])
    b.apply([stored([100, 101], None, "DISK")])
    with pytest.raises(EventRejected) as exc:
        b.apply([stored([200, 201, 202, 203, 204], None, "CPU_PINNED")])
    assert exc.value.kind == "capacity" and "CPU_PINNED" in str(exc.value)
    assert b.refused == {"CPU_PINNED": 5}
    assert b.snapshot() == {"GPU": 8, "CPU_PINNED": 8, "DISK": 2}  # nothing of the refused batch applied
    b.apply([stored([1, 2], None, "CPU_PINNED")])  # stored again: not new, within the bound
    with pytest.raises(EventRejected):
        b.apply([stored(list(range(300, 303)), None)])  # the device too


def test_a_batch_is_applied_in_steps_with_the_same_result() -> None:
    hashes = list(range(1, 200_001))
    whole, steps = new_worker_blocks(), new_worker_blocks()
    whole.apply([stored(hashes, None)])
    gen = steps.apply_steps([stored(hashes, None)], step_blocks=50_000)
    yields = 0
    with pytest.raises(StopIteration) as done:
        while True:
            next(gen)
            yields += 1
    assert yields == 3 + 1 and done.value.value.stored == 200_000  # 1: after the check of its one event
    assert steps.device == whole.device and len(steps) == len(whole) == 200_000


def _stream(**settings: object) -> KvStream:
    s = KvStream("http://w", "tcp://127.0.0.1:1", None, "", settings=new_stream_settings(**settings))
    s.seq.state, s.seq.last_seq = "exact", 0
    return s


def _batch(events: list[dict]) -> bytes:
    return msgspec.msgpack.encode([time.time(), events, 0])


def test_the_loop_runs_while_an_800k_hash_batch_is_applied() -> None:
    rng = random.Random(1)
    payload = _batch([stored([rng.getrandbits(63) for _ in range(800_000)], None)])
    s = _stream()

    async def main() -> int:
        ticks = 0
        stop = False

        async def tick() -> None:
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(tick())
        await asyncio.sleep(0)
        before = ticks
        await s.apply_batch(1, payload)
        stop = True
        await t
        return ticks - before

    ran = asyncio.run(main())
    assert s.last_seq == 1 and len(s.blocks) == 800_000
    assert ran >= 10, ran  # the loop turned between the slices (it did not turn at all before)


def test_an_untrusted_stream_frees_its_blocks_at_once() -> None:
    s = _stream(max_blocks=5000, max_blocks_per_medium=2000)

    async def main() -> None:
        await s.apply_batch(1, _batch([stored(list(range(1, 1501)), None, m) for m in ("GPU", "CPU_PINNED")]))
        assert len(s.blocks) == 1500 and s.blocks.snapshot() == {"GPU": 1500, "CPU_PINNED": 1500}
        seen: list[tuple[str, int]] = []
        s.on_event = lambda _s, what, n: seen.append((what, n))
        await s.apply_batch(2, _batch([stored(list(range(2001, 3001)), 1500, "CPU_PINNED")]))
        assert ("refused:CPU_PINNED", 1000) in seen and ("rejected:capacity", 1) in seen

    asyncio.run(main())
    assert s.state == "untrusted" and len(s.blocks) == 0 and s.blocks.snapshot() == {"GPU": 0}


def test_a_flooding_stream_frees_its_blocks_when_it_is_paused() -> None:
    s = _stream()
    asyncio.run(s.apply_batch(1, _batch([stored(list(range(1, 1001)), None, m) for m in ("GPU", "DISK")])))
    assert s.blocks.snapshot() == {"GPU": 1000, "DISK": 1000}
    s.reject("flood", "more than 16777216 bytes/s")  # what _run does before the pause
    assert s.state == "untrusted" and len(s.blocks) == 0  # not held through the 30 s pause


def test_dropped_blocks_are_freed_at_once_in_one_piece_per_medium() -> None:
    """A medium's blocks are one array (core/routing/blocktable.py), no int object per block: a drop
    frees each in one piece (millions of ints freed at once held the loop 107-160 ms; they were freed
    in slices from a task then), and the stream's own blocks are empty at once."""

    async def main() -> None:
        s = _stream()
        await s.apply_batch(1, _batch([stored(list(range(1, 40_001)), None, m) for m in ("GPU", "DISK")]))
        old = [s.blocks.device, s.blocks.other["DISK"]]
        assert all(len(d) == 40_000 for d in old)
        arrays = [weakref.ref(d._t) for d in old]
        del old
        s.restarted()
        assert len(s.blocks) == 0 and s.blocks.snapshot() == {"GPU": 0}
        assert all(a() is None for a in arrays)  # freed now, with no task left to run

    asyncio.run(main())


def test_a_block_costs_no_python_object() -> None:
    """16-28 bytes a block (a dict of ints was ~100 with the int objects: 3.2M blocks in four media 323 MB,
    issue 28)."""
    rng = random.Random(0)
    batches = [[stored([rng.getrandbits(63) for _ in range(100_000)], None, m)] for m in ("GPU", "DISK")]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        b = new_worker_blocks()
        for batch in batches:
            b.apply(batch)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(b) == 200_000 and (after - before) / 200_000 < 35  # (dicts: ~52 without the ints)


def test_a_batch_is_decoded_one_event_at_a_time_with_the_same_rejections() -> None:
    from infer_ctl.router.kvindex.stream_blocks import decode

    evs = [stored(list(range(i * 10_000, (i + 1) * 10_000)), None) for i in range(3)]
    assert asyncio.run(decode(_batch(evs))) == evs
    for payload, kind in ((b"\xc1\xff\x00garbage", "decode"), (msgspec.msgpack.encode({"not": "a batch"}), "malformed"),
                          (msgspec.msgpack.encode([0.0, "events", 0]), "malformed"),
                          (msgspec.msgpack.encode([0.0]), "malformed")):
        with pytest.raises(EventRejected) as exc:
            asyncio.run(decode(payload))
        assert exc.value.kind == kind, payload
