"""BlockTable (core/routing/blocktable.py) against a plain set: adds, removals (the run shifted back),
hashes sharing a home slot, a run reaching the tail's end, the ints the array cannot hold (0, outside
int64), growth in steps, and `member` over several tables."""

from __future__ import annotations

import random

from infer_ctl.core.routing.blocktable import BlockTable, member

ODD = [0, -(1 << 63) - 1, 1 << 63, (1 << 64) - 1, 1 << 70]
EDGE = [-(1 << 63), (1 << 63) - 1, 1, -1]


def _check(t: BlockTable, model: set[int], pool: list[int]) -> None:
    assert len(t) == len(model) and set(t) == model
    assert [t.has(h) for h in pool] == [h in model for h in pool] == [h in t for h in pool]
    assert t.missing(pool) == [h for h in pool if h not in model]


def test_a_table_follows_a_set_under_random_adds_and_removals() -> None:
    rng = random.Random(3)
    for _ in range(200):
        pool = [rng.getrandbits(63) * rng.choice((1, -1)) for _ in range(40)] + ODD + EDGE
        t, model = BlockTable(), set()
        for _ in range(25):
            hs = [rng.choice(pool) for _ in range(rng.randrange(0, 40))]
            if rng.random() < 0.6:
                new = t.add(hs)
                assert sorted(new) == sorted(set(hs) - model) and len(new) == len(set(new))
                model |= set(hs)
            else:
                gone = t.remove(hs)
                assert sorted(gone) == sorted(set(hs) & model) and len(gone) == len(set(gone))
                model -= set(hs)
            _check(t, model, pool)


def test_hashes_sharing_a_home_slot_are_found_after_removals_in_the_run() -> None:
    t = BlockTable()
    p = t._p
    run = [k * p + 5 for k in range(1, 13)]  # one home slot: one run of 12
    assert t.add(run) == run
    for gone in (run[3], run[0], run[11]):
        assert t.remove([gone]) == [gone]
    model = set(run) - {run[3], run[0], run[11]}
    _check(t, model, run)
    assert t.add(run) == [run[0], run[3], run[11]]


def test_a_run_reaching_the_tail_end_sizes_the_table_again() -> None:
    t = BlockTable()
    p = t._p
    run = [k * p + p - 1 for k in range(1, 100)]  # home: the last home slot, more than the tail holds
    assert len(t.add(run)) == 99 and t._p != p
    _check(t, set(run), [*run, p - 1])


def test_consecutive_hashes_do_not_make_one_long_run() -> None:
    """A publisher's choice of hashes (consecutive ints, multiples of a power of two) must not pile into
    one run of slots that every lookup landing in it walks: the home is `h * m % p`, m and p secret."""
    for hashes in (list(range(1, 100_001)), [k << 22 for k in range(1, 100_001)]):
        t = BlockTable(hashes)
        run = longest = 0
        for v in t._t:
            run = run + 1 if v else 0
            longest = max(longest, run)
        assert longest < 200 and all(map(t.has, hashes[:1000]))


def test_growth_in_steps_reads_the_old_table_until_it_is_done() -> None:
    rng = random.Random(5)
    first = [rng.getrandbits(63) for _ in range(20_000)]
    t = BlockTable(first)
    old_p, old_has = t._p, t.has
    steps = t.reserve(200_000, step=4096)
    next(steps)  # part way: the table reads as before
    assert t._p == old_p and t.has is old_has and all(map(t.has, first[:500]))
    for _ in steps:
        pass
    assert t._p > old_p and len(t) == 20_000 and all(map(t.has, first))
    more = [rng.getrandbits(63) for _ in range(100_000)]
    p = t._p
    t.add(more)
    assert t._p == p  # reserved: no growth in one piece
    assert t == BlockTable(first + more) and t != BlockTable(first)


def test_member_is_any_of_the_tables() -> None:
    rng = random.Random(7)
    pool = [rng.getrandbits(63) for _ in range(30)] + ODD + EDGE
    for _ in range(200):
        sets = [set(rng.sample(pool, rng.randrange(0, 20))) for _ in range(rng.randrange(1, 5))]
        has = member(tuple(BlockTable(s) for s in sets))
        assert [has(h) for h in pool] == [any(h in s for s in sets) for h in pool]
