"""The pending overlay's queue (core/routing/coalesce.py `PendingBlocks.add_later`): a flight queued on the
request path and applied at the next use of the overlay answers every reader as the flight added at once
did - the overlay as it was before the queue and the two dicts per worker (an object per block, re-stated
here as `_OldPending`), on random operation sequences. And the flight board as the queue leaves it: a
follower promoted before its own turn's end is published as computing what it took over."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence

import pytest

from infer_ctl.core.routing.coalesce import COMPUTING, Flight, PendingBlocks
from infer_ctl.router.fleet import shared_flights as sf
from infer_ctl.router.fleet.shared_load import SharedLoad
from tests.router.fleet.test_shared_flights_holds import Process, Scripted, go, request, run, started_within


class _OldEntry:
    __slots__ = ("owner", "refs")

    def __init__(self, owner: Flight | None) -> None:
        self.refs = 0
        self.owner = owner


class _OldPending:
    """The overlay as it was before `add_later` (an `_Entry` per block, every flight added at once): the
    reference the queued overlay must agree with."""

    def __init__(self) -> None:
        self.by_worker: dict[str, dict[int, _OldEntry]] = {}

    def depth(self, worker: str, hashes: Sequence[int]) -> int:
        entries = self.by_worker.get(worker)
        if not entries:
            return 0
        n = 0
        while n < len(hashes) and hashes[n] in entries:
            n += 1
        return n

    def leader(self, worker: str, hashes: Sequence[int], exclude: Flight | None = None,
               limit: int | None = None) -> tuple[Flight | None, int]:
        d = self.depth(worker, hashes)
        if d == 0:
            return None, 0
        entries = self.by_worker[worker]
        top_i = d - 1
        while exclude is not None and top_i >= 0 and entries[hashes[top_i]].owner is exclude:
            top_i -= 1
        if top_i < 0:
            return None, 0
        top = entries[hashes[top_i]].owner
        if top is None or not top.computing:
            return None, 0
        n = 0
        for i in range(top_i, -1, -1):
            owner = entries[hashes[i]].owner
            if owner is None or not owner.computing or owner is exclude:
                break
            n += 1
            if n == limit:
                break
        return top, n

    def add(self, flight: Flight, held_blocks: int) -> int:
        if flight.added:
            return len(flight.hashes)
        entries = self.by_worker.setdefault(flight.worker, {})
        n = first = len(flight.hashes)
        for i, h in enumerate(flight.hashes):
            e = entries.get(h)
            if e is None:
                e = entries[h] = _OldEntry(flight if i >= held_blocks else None)
                if first == n and i >= held_blocks:
                    first = i
            elif i >= held_blocks and (e.owner is None or e.owner.state != COMPUTING):
                e.owner = flight
                if first == n:
                    first = i
            e.refs += 1
        flight.added = True
        return first

    def claim(self, flight: Flight, held_blocks: int) -> int:
        entries = self.by_worker.get(flight.worker)
        if entries is None or not flight.added or not flight.computing:
            return 0
        n = 0
        for h in flight.hashes[held_blocks:]:
            e = entries.get(h)
            if e is not None and e.owner is not flight and (e.owner is None or not e.owner.computing):
                e.owner = flight
                n += 1
        return n

    def hand_over(self, failed: Flight, heirs: Sequence[Flight]) -> int:
        entries = self.by_worker.get(failed.worker)
        if entries is None or not failed.added:
            return 0
        mine, done, n = failed.hashes, 0, 0
        for heir in heirs:
            if not heir.added or heir.worker != failed.worker:
                continue
            lo = 0
            while lo < min(len(mine), len(heir.hashes)) and mine[lo] == heir.hashes[lo]:
                lo += 1
            for i in range(done, lo):
                e = entries.get(mine[i])
                if e is not None and e.owner is failed:
                    e.owner = heir
                    n += 1
            done = max(done, lo)
        return n

    def remove(self, flight: Flight) -> None:
        if not flight.added:
            return
        flight.added = False
        entries = self.by_worker.get(flight.worker)
        if entries is None:
            return
        for h in flight.hashes:
            e = entries.get(h)
            if e is None:
                continue
            e.refs -= 1
            if e.refs <= 0:
                del entries[h]
            elif e.owner is flight:
                e.owner = None
        if not entries:
            del self.by_worker[flight.worker]

    def snapshot(self) -> dict[str, int]:
        return {w: len(e) for w, e in self.by_worker.items()}


WORKERS = ("w0", "w1")


def _chain(rng: random.Random) -> list[int]:
    """A root-to-node path of a small tree (branching 2, depth 1-7): chains that share prefixes."""
    path: tuple[int, ...] = ()
    out = []
    for _ in range(rng.randint(1, 7)):
        path = (*path, rng.randint(0, 1))
        out.append(hash(path))
    return out


def _differential(seed: int, steps: int = 120) -> tuple[dict[str, int], dict[str, int], int]:
    """One random sequence, applied to both overlays: each flight a pair (old, new) moved together; the new
    overlay's flights queued (`add_later`, as the router's) or added at once (a mirrored flight), the turn
    ending (`settle`) now and then. Every read, and each flight's first computed block, must agree.
    Returns both overlays' final snapshots and how many reads were compared."""
    rng = random.Random(seed)
    old, new = _OldPending(), PendingBlocks()
    pairs: list[tuple[Flight, Flight]] = []
    of_new: dict[int, int] = {}  # id(new flight) -> index in pairs
    own: dict[int, int] = {}  # the old `add`'s answer per pair, for `Flight.first`
    later: list[int] = []  # pairs queued this turn
    reads = 0

    def same(o: Flight | None, n: Flight | None) -> bool:
        if o is None or n is None:
            return o is n
        return pairs[of_new[id(n)]][0] is o

    def settled() -> None:
        for i in later:
            assert pairs[i][1].first == own[i], (seed, "first", i)
        later.clear()

    for step in range(steps):
        op = rng.random()
        live = [i for i, (o, _) in enumerate(pairs) if o.computing]
        added = [i for i, (o, _) in enumerate(pairs) if o.added]
        where = (seed, step)
        if op < 0.3 or not pairs:  # a request's flight (queued) or a mirrored one (at once)
            worker, hashes = rng.choice(WORKERS), _chain(rng)
            held = rng.choice((0, 0, 0, 1, 2, len(hashes)))
            o, n = Flight(worker, hashes), Flight(worker, hashes)
            of_new[id(n)] = len(pairs)
            pairs.append((o, n))
            own[len(pairs) - 1] = old.add(o, held)
            if rng.random() < 0.75:
                new.add_later(n, held)
                later.append(len(pairs) - 1)
            else:
                assert new.add(n, held) == own[len(pairs) - 1], where
                settled()  # `add` applied the queue first
        elif op < 0.42 and live:  # a landing or a failure (a flight queued this turn too)
            o, n = pairs[rng.choice(live)]
            if rng.random() < 0.5:
                o.land(), n.land()
            else:
                o.fail(), n.fail()
        elif op < 0.5 and added:  # a failed leader hands over to some of its worker's flights
            o, n = pairs[rng.choice(added)]
            heirs = [i for i in added if pairs[i][0].worker == o.worker and pairs[i][0] is not o]
            rng.shuffle(heirs)
            heirs = heirs[:3]
            o.fail(), n.fail()
            assert old.hand_over(o, [pairs[i][0] for i in heirs]) == \
                new.hand_over(n, [pairs[i][1] for i in heirs]), where
            settled()
        elif op < 0.55 and added:  # a follower promoted in another process claims
            i = rng.choice(added)
            held = rng.randint(0, 3)
            assert old.claim(pairs[i][0], held) == new.claim(pairs[i][1], held), where
            settled()
        elif op < 0.7 and added:  # a request's end (or its grace)
            o, n = pairs[rng.choice(added)]
            old.remove(o)
            new.remove(n)
            settled()
        elif op < 0.8:  # the turn ends (`Coalescer._enter`)
            new.settle()
            settled()
        else:  # a reader: the picker's depth, the hold's leader (a follower's, excluding itself)
            worker, hashes = rng.choice(WORKERS), _chain(rng)
            exclude = pairs[rng.randrange(len(pairs))] if rng.random() < 0.3 else None
            if exclude is not None:
                worker, hashes = exclude[0].worker, list(exclude[0].hashes)
            limit = rng.choice((None, 1, 3))
            assert old.depth(worker, hashes) == new.depth(worker, hashes), where
            settled()
            lo, no = old.leader(worker, hashes, exclude[0] if exclude else None, limit)
            ln, nn = new.leader(worker, hashes, exclude[1] if exclude else None, limit)
            assert no == nn and same(lo, ln), (where, lo, ln)
            assert old.snapshot() == new.snapshot(), where
            reads += 1
    new.settle()
    settled()
    return old.snapshot(), new.snapshot(), reads


@pytest.mark.parametrize("seed", range(400))
def test_the_queued_overlay_answers_as_the_overlay_that_added_at_once(seed: int) -> None:
    old, new, reads = _differential(seed)
    assert old == new, seed
    assert reads > 0, "the sequence compared no read"


def test_a_flight_queued_before_its_leader_landed_does_not_take_the_landed_blocks() -> None:
    """The case the random sequences found: a follower held for a computing leader, the leader landing
    in the same turn, before the follower joined the overlay. Joined after the landing, the follower took
    the landed blocks as its own to compute, and the next request (same prompt) waited for the follower's
    first byte for blocks already on the worker."""
    p = PendingBlocks()
    system = list(range(1, 21))
    lead, follow = Flight("w", [*system, 100]), Flight("w", [*system, 200])
    p.add(lead, 0)
    assert p.leader("w", follow.hashes)[0] is lead  # the follower's run: held for it
    p.add_later(follow, 0)
    lead.land()  # its first byte, the same turn
    assert p.leader("w", [*system, 300]) == (None, 0)
    assert follow.first == 20  # computes only its own tail


# ---- the flight board --------------------------------------------------------------------------------------
@pytest.fixture
def block() -> Iterator[SharedLoad]:
    b = SharedLoad.create(2, 8, extra=sf.ROW_CELLS)
    yield b
    b.close()


@pytest.mark.parametrize("read_between", [False, True])
def test_a_follower_promoted_in_the_turn_it_was_held_is_published_as_computing(block: SharedLoad,
                                                                                 read_between: bool) -> None:
    """A follower held for a leader whose client left in that same turn: promoted before its turn's end,
    it claimed the leader's blocks on the board before it was published there (the claim found no slot),
    then was published as held up to where it first computed at its join - so another process's request
    for the same prefix took the blocks it computes for held and went to compute them again. With
    `read_between`, another request's decision reads the overlay between the hold and the leader's end."""
    async def main() -> None:
        a, b = Process(block, 0), Process(block, 1)
        la, fa, gb = Scripted(), Scripted(), Scripted()
        leader = go(a, request("leader", stream=True), la)
        await la.started.wait()
        await asyncio.sleep(0)  # the leader's turn ended: it is published
        follower = go(a, request("follower", stream=True), fa)  # held in the next turn ...
        if read_between:
            asyncio.get_running_loop().call_soon(a.co.pending.settle)
        leader.cancel()  # ... and its leader's client leaves in that same turn, after it
        with pytest.raises(asyncio.CancelledError):
            await leader
        assert await started_within(fa, 0.5) and a.co.promoted == 1
        b.co.sync()
        third = go(b, request("third", stream=True), gb)
        await asyncio.sleep(0.05)
        assert b.co.holding == 1, "process 1 took the promoted follower's blocks for held"
        fa.land.set()
        assert await started_within(gb, 0.5)
        fa.answer.set()
        gb.answer.set()
        await asyncio.gather(follower, third)
    run(main)
