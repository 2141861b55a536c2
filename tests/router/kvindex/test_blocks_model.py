"""WorkerBlocks against a naive model (one set per medium, the rules of core/routing/blocks.py written
out plainly) under random batches of every event kind: repeated hashes in one event, a hash in two events
of a batch, removals of blocks on two media or on none, every medium, clears, orphans and batches that
pass `max_blocks` part way. A refused batch leaves everything as it was; `len` is the union's size."""

from __future__ import annotations

import copy
import time
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from infer_ctl.core.routing.blocks import MEDIA, EventRejected, WorkerBlocks
from tests.router.conftest import new_worker_blocks

MAX = 12
HASHES = st.integers(0, 24)
MEDIUM = st.sampled_from(sorted(MEDIA))


def _store(hashes: list[int], parent: int | None, medium: str) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [0] * len(hashes), "block_size": 1, "medium": medium}


EVENT = st.one_of(
    st.builds(_store, st.lists(HASHES, max_size=MAX + 2), st.one_of(st.none(), HASHES), MEDIUM),
    st.builds(lambda hs, m: {"type": "BlockRemoved", "block_hashes": hs, "medium": m},
              st.lists(HASHES, max_size=8), MEDIUM),
    st.just({"type": "AllBlocksCleared"}),
)


def model(media: dict[str, set[int]], batch: list[dict[str, Any]], max_blocks: int) -> dict[str, set[int]] | None:
    """The media after `batch`, or None when it is refused: a store under a parent neither stored
    earlier in the batch nor held (a clear earlier in the batch forgets what was held), a store listing
    more than max_blocks, or more than max_blocks distinct blocks at any point counting what the batch
    stores (its removals not subtracted: the bound is checked before anything is applied)."""
    held = set().union(*media.values())
    running, stored_here, cleared = set(held), set(), False
    for ev in batch:
        if ev["type"] == "AllBlocksCleared":
            running, stored_here, cleared = set(), set(), True
        elif ev["type"] == "BlockStored":
            p = ev["parent_block_hash"]
            if len(ev["block_hashes"]) > max_blocks:
                return None
            if p is not None and p not in stored_here and (cleared or p not in held):
                return None
            stored_here |= set(ev["block_hashes"])
            running |= set(ev["block_hashes"])
            if len(running) > max_blocks:
                return None
    out = {m: set(s) for m, s in media.items()}
    for ev in batch:
        if ev["type"] == "AllBlocksCleared":
            out = {}
        elif ev["type"] == "BlockStored":
            out.setdefault(ev["medium"], set()).update(ev["block_hashes"])
        else:
            out.get(ev["medium"], set()).difference_update(ev["block_hashes"])
    return out


def _state(b: WorkerBlocks) -> tuple[dict[str, set[int]], int]:
    media = {"GPU": set(b.device), **{m: set(s) for m, s in b.other.items()}}
    return {m: s for m, s in media.items() if s}, len(b)


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(EVENT, max_size=6), max_size=12))
# 13 distinct blocks stored, then cleared in the same batch (accepted before: the bound read the end)
@example([[_store(list(range(9, 13)), None, "CPU_PINNED"), _store(list(range(9)), None, "CPU_PINNED"),
           {"type": "AllBlocksCleared"}]])
def test_blocks_follow_the_naive_model(batches: list[list[dict[str, Any]]]) -> None:
    b = new_worker_blocks(max_blocks=MAX)
    media: dict[str, set[int]] = {}
    for batch in batches:
        want = model(media, batch, MAX)
        before = _state(b)
        try:
            b.apply(copy.deepcopy(batch))
        except EventRejected:
            assert want is None, batch
            assert _state(b) == before  # nothing applied
            continue
        assert want is not None, batch
        media = {m: s for m, s in want.items() if s}
        got, n = _state(b)
        assert got == media
        assert n == len(set().union(*media.values())) <= MAX


def test_a_batch_never_holds_more_than_max_blocks_before_its_clear() -> None:
    """Blocks stored past the bound and cleared later in the same batch: the sets grew to the batch's
    whole size while it was applied (a publisher could hold k x max_blocks, bounded by the message size
    alone); each store is counted where it stands, as before distinct blocks were counted."""
    b = new_worker_blocks(max_blocks=1024)
    batch = [_store(list(range(i * 1000, i * 1000 + 1000)), None, "GPU") for i in range(20)]
    try:
        b.apply([*batch, {"type": "AllBlocksCleared"}])
        raise AssertionError("20000 distinct blocks were held at once under max_blocks=1024")
    except EventRejected as exc:
        assert exc.kind == "capacity"


def test_a_hostile_list_is_refused_before_the_walk() -> None:
    """A list longer than max_blocks costs its length check only, even when near the bound."""
    b = new_worker_blocks(max_blocks=1 << 20)
    b.apply([_store(list(range(1000)), None, "GPU")])
    huge = _store([0] * 10**6 + ["x"], None, "GPU")  # type: ignore[list-item]
    huge["block_hashes"] += [0] * (1 << 20)
    t = time.perf_counter()
    try:
        b.apply([huge])
        raise AssertionError("accepted")
    except EventRejected as exc:
        assert exc.kind == "capacity"
    assert time.perf_counter() - t < 0.01
    assert len(b) == 1000
