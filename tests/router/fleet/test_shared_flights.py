"""The flight board (router/fleet/shared_flights.py): one router process's in-flight prompts mirrored into
another's pending overlay through the shared block, without a lock. Two boards on one real shared-memory
block stand for two processes (each writes only its own row)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from infer_ctl.core.routing.coalesce import Flight, PendingBlocks
from infer_ctl.core.routing.index import block_hashes
from infer_ctl.router.fleet import shared_flights as sf
from infer_ctl.router.fleet.shared_load import SharedLoad

URLS = ["http://w0", "http://w1", "http://w2"]
CLIENT = "client"


class Proc:
    """One process's side: its board, its overlay, and what its mirrored flights heard."""

    def __init__(self, block: SharedLoad, index: int, urls: list[str] = URLS) -> None:
        self.pending = PendingBlocks()
        self.board = sf.FlightBoard(block.cells, block.extra_offset, block.processes, index,
                                    lambda s: urls[s] if 0 <= s < len(urls) else None,
                                    lambda u: urls.index(u) if u in urls else None)
        self.heard: list[tuple[Flight, str, object]] = []

    def sync(self) -> int:
        n = self.board.sync(self.pending, lambda f, s: self.heard.append((f, s, f.cause)),
                            lambda f: ("worker", f.worker), CLIENT)
        for url, first in list(self.board.mirror.lazy):  # as if a decision here read every chain mirrored
            self.board.materialize(self.pending, url, [first])
        return n

    def mirrored(self) -> dict[tuple[str, tuple[int, ...]], str]:
        return {(f.worker, tuple(f.hashes)): f.state for m in self.board.mirror.rows for f in m.values()}

    def mirror_counts(self) -> Counter[tuple[str, tuple[int, ...], str]]:
        return Counter((f.worker, tuple(f.hashes), f.state) for m in self.board.mirror.rows for f in m.values())


@pytest.fixture
def block() -> Iterator[SharedLoad]:
    b = SharedLoad.create(2, 8, extra=sf.ROW_CELLS)
    yield b
    b.close()


def chain(name: str, blocks: int = 20) -> list[int]:
    return block_hashes((name + " ") * (64 * blocks // (len(name) + 1) + 2), 64)[:blocks]


def flight(url: str, hashes: list[int]) -> Flight:
    return Flight(url, hashes)


def test_a_published_flight_is_held_in_the_other_process_until_it_lands_and_leaves(block: SharedLoad) -> None:
    a, b = Proc(block, 0), Proc(block, 1)
    h = chain("tenant one system prompt")
    f = flight(URLS[1], h)
    a.pending.add(f, 3)
    a.board.publish(f, 3)
    assert b.sync() == 1
    assert b.pending.depth(URLS[1], h) == len(h) and b.pending.depth(URLS[0], h) == 0
    leader, computing = b.pending.leader(URLS[1], [*h, 123])
    assert leader is not None and isinstance(leader.tag, sf.Remote) and computing == len(h) - 3
    assert b.sync() == 0  # nothing changed: one version read
    f.land()
    a.board.state(f, sf.LANDED)
    assert b.sync() == 1
    assert [(s, c) for _, s, c in b.heard] == [("landed", None)]
    assert b.pending.depth(URLS[1], h) == len(h)  # landed, still pending until its owner lets go
    assert b.pending.leader(URLS[1], h)[0] is None  # nobody computes it any more
    a.pending.remove(f)
    a.board.free(f)
    b.sync()
    assert b.pending.depth(URLS[1], h) == 0 and not b.mirrored()
    assert len(b.heard) == 1  # the end was heard once


@pytest.mark.parametrize(("state", "cause"), [(sf.FAILED_WORKER, ("worker", URLS[2])), (sf.FAILED, CLIENT)])
def test_a_failed_flight_tells_its_followers_who_failed_it(block: SharedLoad, state: int, cause: object) -> None:
    a, b = Proc(block, 0), Proc(block, 1)
    f = flight(URLS[2], chain("x"))
    a.board.publish(f, 0)
    b.sync()
    a.board.state(f, state)
    a.board.free(f)  # both between two looks: the freed slot remembers how it ended
    b.sync()
    assert [(s, c) for _, s, c in b.heard] == [("failed", cause)]
    assert not b.mirrored()


def test_a_slot_reused_between_two_looks_ends_the_old_flight_and_mirrors_the_new(block: SharedLoad) -> None:
    a, b = Proc(block, 0), Proc(block, 1)
    f1, f2 = flight(URLS[0], chain("first")), flight(URLS[1], chain("second"))
    a.board.publish(f1, 0)
    b.sync()
    a.board.free(f1)
    a.board.publish(f2, 0)  # the same (lowest free) slot
    assert a.board.own.slots[f2] == 0
    b.sync()
    assert [s for _, s, _ in b.heard] == ["landed"]  # its followers go
    assert b.mirrored() == {(URLS[1], tuple(f2.hashes)): "computing"}


def test_a_slot_being_written_or_torn_is_not_mirrored_until_whole(block: SharedLoad) -> None:
    a, b = Proc(block, 0), Proc(block, 1)
    f = flight(URLS[0], chain("torn"))
    a.board.publish(f, 0)
    base = sf.slot_base(a.board.own.offset, 0, 0)
    block.cells[base + sf.GEN] += 1  # odd: a writer mid-change
    assert b.sync() == 0 and not b.mirrored()
    block.cells[base + sf.GEN] += 1
    block.cells[base + sf._SLOT_HEAD + 5] ^= 1  # a hash that does not match the checksum
    block.cells[a.board.own.base + sf.VERSION] += 1
    b.sync()  # mirrored (its first block), but its chain never joins the overlay torn
    assert b.pending.blocks(URLS[0]) == 0
    block.cells[base + sf._SLOT_HEAD + 5] ^= 1
    block.cells[base + sf.GEN] += 2
    block.cells[a.board.own.base + sf.VERSION] += 1
    b.sync()
    assert len(b.mirrored()) == 1 and b.pending.depth(URLS[0], f.hashes) == len(f.hashes)


def test_a_row_of_another_hashing_or_an_unknown_worker_is_ignored_without_rescanning(block: SharedLoad) -> None:
    a, b = Proc(block, 0), Proc(block, 1, urls=URLS[:1])
    f = flight(URLS[2], chain("elsewhere"))  # a worker b does not know
    a.board.publish(f, 0)
    assert b.sync() == 0 and not b.mirrored()
    assert b.board.mirror.seen[0] == block.cells[a.board.own.base + sf.VERSION]  # the row counts as read
    block.cells[a.board.own.base + sf.PROBE] ^= 2  # another PYTHONHASHSEED
    block.cells[a.board.own.base + sf.VERSION] += 1
    g = flight(URLS[0], chain("known"))
    a.board.publish(g, 0)
    assert b.sync() == 0 and not b.mirrored() and b.board.foreign == {0}


@pytest.mark.parametrize("how", ["restart", "zero_row", "close"])
def test_a_process_gone_or_restarted_releases_everyone_waiting_for_its_flights(block: SharedLoad, how: str) -> None:
    a, b = Proc(block, 0), Proc(block, 1)
    f = flight(URLS[0], chain("dies"))
    a.board.publish(f, 0)
    b.sync()
    if how == "restart":  # a new process in the same row: ids and generations count from 1 again
        a = Proc(block, 0)
        g = flight(URLS[1], chain("reborn"))
        a.board.publish(g, 0)
    elif how == "zero_row":
        block.zero_row(0)  # the supervisor, for a process killed with -9
    else:
        a.board.close()
    b.sync()
    assert [s for _, s, _ in b.heard] == ["failed"]  # one follower there takes over
    assert b.pending.depth(URLS[0], f.hashes) == 0
    want = {(URLS[1], tuple(g.hashes)): "computing"} if how == "restart" else {}
    assert b.mirrored() == want


def test_more_flights_than_slots_stay_local(block: SharedLoad) -> None:
    a, b = Proc(block, 0), Proc(block, 1)
    flights = [flight(URLS[0], chain(f"p{i}", 2)) for i in range(sf.SLOTS + 5)]
    for f in flights:
        a.board.publish(f, 0)
    assert a.board.unpublished == 5
    b.sync()
    assert len(b.mirrored()) == sf.SLOTS


@pytest.mark.parametrize("seed", range(8))
def test_the_mirror_equals_what_the_other_process_published_after_any_sequence(block: SharedLoad, seed: int) -> None:
    """Random publishes, landings, failures and frees in process 0, process 1 looking now and then:
    after each look its mirror is exactly process 0's published flights (worker, chain, landed or
    computing), and every mirrored flight that ended was heard to end exactly once."""
    rng = random.Random(seed)
    a, b = Proc(block, 0), Proc(block, 1)
    live: dict[Flight, str] = {}
    prompts = [chain(f"tenant {i}", rng.randint(1, 40)) for i in range(12)]
    for _ in range(600):
        op = rng.random()
        if op < 0.35 and len(live) < sf.SLOTS:
            f = flight(rng.choice(URLS), rng.choice(prompts)[: rng.randint(1, 40)])
            a.board.publish(f, rng.randint(0, 5))
            live[f] = "computing"
        elif op < 0.6 and live:
            f = rng.choice([f for f in live])
            if live[f] == "computing":
                live[f] = "landed" if rng.random() < 0.7 else "failed"
                a.board.state(f, sf.LANDED if live[f] == "landed" else rng.choice([sf.FAILED, sf.FAILED_WORKER]))
        elif op < 0.85 and live:
            f = rng.choice([f for f in live if live[f] != "computing"] or [None])  # type: ignore[list-item]
            if f is not None:
                a.board.free(f)
                del live[f]
        else:
            b.sync()
            want = Counter((f.worker, tuple(f.hashes), s) for f, s in live.items() if s != "failed")
            got = Counter({k: v for k, v in b.mirror_counts().items() if k[2] != "failed"})
            assert got == want
    ended: dict[int, int] = {}
    for f, _, _ in b.heard:
        ended[id(f)] = ended.get(id(f), 0) + 1
    assert all(n == 1 for n in ended.values())


def test_block_size_and_zeroing_cover_the_board() -> None:
    blk = SharedLoad.create(3, 4, extra=sf.ROW_CELLS)
    try:
        assert len(blk.cells) >= 3 * (blk.stride + sf.ROW_CELLS)
        boards = [Proc(blk, i) for i in range(3)]
        f: Any = flight(URLS[0], chain("z"))
        boards[2].board.publish(f, 0)
        blk.zero_row(2)
        start = blk.extra_offset + 2 * sf.ROW_CELLS
        assert not any(blk.cells[start:start + sf.ROW_CELLS])
        assert any(blk.cells[blk.extra_offset:blk.extra_offset + sf.ROW_CELLS])  # row 0 kept
    finally:
        blk.close()


def test_the_board_is_not_counted_as_load(block: SharedLoad) -> None:
    """The load of a worker is its column over the load rows only: the board's cells follow them in the
    same block (a strided sum over the whole block read flight hashes as in-flight requests)."""
    a = Proc(block, 0)
    a.board.publish(flight(URLS[0], chain("load")), 0)
    assert any(block.cells[block.extra_offset:])
    assert [block.total(s) for s in range(block.slots)] == [0] * block.slots
