"""The exact index's pure parts: a worker's blocks from events (all-or-nothing batches, the medium kept),
anchors (prompt text blocks -> the worker's token pages) against a radix cache modelled by hand, the
policy's exact path, the predicted index's corrections, `n` of a request."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.kvevents.hashing import block_hashes, pack_bigrams, page_digests
from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer
from infer_ctl.core.routing.anchors import AnchorTable, full_key
from infer_ctl.core.routing.blocks import EventRejected, WorkerBlocks
from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.index import block_hashes as text_chain
from infer_ctl.core.routing.pd import parallel_samples
from infer_ctl.core.routing.policy import PolicyConfig, WorkerView, choose_prefill

TOK = BuiltinTokenizer()


class Tok:
    def encode_with_ends(self, text: str, start: bool) -> tuple[list[int], list[int]]:
        return TOK.encode_with_ends(text)


def stored(hashes: list[int], parent: int | None, n: int = 1, medium: str | None = "GPU") -> dict:
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": [0] * n * len(hashes),
          "block_size": n}
    if medium is not None:
        ev["medium"] = medium
    return ev


def test_blocks_store_remove_clear_and_media() -> None:
    b = WorkerBlocks()
    eff = b.apply([stored([1, 2], None), stored([3], 2, medium=None), stored([9], None, medium="CPU_PINNED")])
    assert eff.stored == 4 and b.holds(3) and not b.holds(9) and b.snapshot() == {"GPU": 3, "CPU_PINNED": 1}
    b.apply([{"type": "BlockRemoved", "block_hashes": [3, 77]}])
    assert not b.holds(3) and b.holds(2)
    b.apply([{"type": "AllBlocksCleared"}, stored([5], None)])
    assert b.snapshot() == {"GPU": 1}


@pytest.mark.parametrize(("events", "kind"), [
    ([stored([1], 42)], "orphan"),
    ([{"type": "Nope"}], "unknown_event"),
    ([{"type": "BlockRemoved", "block_hashes": list(range(70_000))}], "oversized"),
    ([{"type": "BlockRemoved", "block_hashes": "x"}], "malformed"),
    ([stored([1], None), {"type": "BlockStored", "block_hashes": [2], "parent_block_hash": 1, "token_ids": [1, 2, 3],
                          "block_size": 1}], "malformed"),
    ([stored(list(range(20)), None)], "capacity"),
])
def test_blocks_refuse_a_batch_whole(events: list, kind: str) -> None:
    b = WorkerBlocks(max_blocks=10, max_event_blocks=50_000)
    b.apply([stored([100], None)])
    with pytest.raises(EventRejected) as exc:
        b.apply(events)
    assert exc.value.kind == kind
    assert b.snapshot() == {"GPU": 1}  # nothing of the refused batch


class _Node:
    def __init__(self, key: list[int], parent: _Node | None) -> None:
        self.key, self.parent = key, parent


def test_a_long_prompt_at_page_1_is_one_event_and_is_accepted() -> None:
    """SGLang merges a chain's stores (and a step's removals) into one event, so a 100k-token prompt at
    its default page size 1 is one BlockStored of 100k hashes (the simulator's builder records what
    SGLang's recorder does, tests/sim/test_kv_events_sglang.py). It was refused as "oversized" (a fixed
    65536 per event) and the worker went untrusted for serving a long prompt (review of issue 19)."""
    from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder

    rec, build = KvEventRecorder(), KvEventBuilder(1)
    root = _Node([], None)
    node = _Node(list(range(100_000)), root)
    rec.record_store(node)
    events = build.build(rec.take())
    assert len(events) == 1 and len(events[0]["block_hashes"]) == 100_000
    b = WorkerBlocks()
    assert b.apply(events).stored == 100_000
    rec.record_remove(node)
    assert b.apply(build.build(rec.take())).removed == 100_000 and len(b) == 0


def worker_pages(ids: list[int], ps: int, bigram: bool) -> list[int]:
    units = pack_bigrams(ids) if bigram else ids
    pages = len(units) // ps
    return block_hashes(page_digests(units[: pages * ps], ps, None, bigram=bigram))


@pytest.mark.parametrize("ps", [1, 4, 16])
@pytest.mark.parametrize("bigram", [False, True])
def test_anchors_predict_what_the_worker_matches(ps: int, bigram: bool) -> None:
    rng = random.Random(ps * 2 + bigram)
    vocab = ["alpha", "beta", "gamma,", "delta.", "cache", "router!", "prefill?", "x"]
    prefix = "System: " + " ".join(rng.choice(vocab) for _ in range(500))
    table = AnchorTable(ps, bigram=bigram)
    held = WorkerBlocks()
    prev = None
    for r in range(25):
        text = prefix + " Q: " + " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 40)))
        if r % 6 == 5 and prev:
            text = prev  # an identical prompt: SGLang matches n - 1 tokens (n - 2 keys on bigrams)
        ids = TOK.encode(text)
        hs = text_chain(text, 64)
        fk = full_key(hs, text, 64)
        predicted = table.cached_units(hs, fk, table.depth(hs), held)
        capped = ids[:-1]
        want = 0
        for h in worker_pages(capped, ps, bigram):
            if not held.holds(h):
                break
            want += ps
        assert predicted <= want
        if r:  # short by at most one text block's tokens, and one page
            assert want - predicted <= 0.02 * len(ids) + ps, (r, predicted, want, len(ids))
        if text == prev:
            assert predicted == want
        held.device.update(worker_pages(ids, ps, bigram))  # the worker inserts the prompt
        table.build(hs, fk, text, Tok())
        prev = text
    assert table.resumed >= 15 and table.resume_mismatch == 0  # the shared prefix is tokenized once


def test_anchors_follow_eviction_and_stay_bounded() -> None:
    table = AnchorTable(1, max_anchors=50)
    held = WorkerBlocks()
    text = "word " * 400
    ids = TOK.encode(text)
    hs = text_chain(text, 64)
    fk = full_key(hs, text, 64)
    table.build(hs, fk, text, Tok())
    pages = worker_pages(ids, 1, False)
    held.device.update(pages[:100])  # the worker holds only the first 100 tokens
    got = table.cached_units(hs, fk, table.depth(hs), held)
    assert 80 <= got <= 100
    assert len(table._blocks) <= 50


def test_policy_exact_path_scores_overlap_minus_load() -> None:
    cfg = PolicyConfig()
    rng = random.Random(0)
    idx = PrefixIndex()
    views = [WorkerView("a", inflight=0), WorkerView("b", inflight=2), WorkerView("c", inflight=0)]
    # b holds 90 % but has 2 requests queued that each cost 100 units; a holds 60 %: b still wins
    pick = choose_prefill(hashes=[], text_chars=0, workers=views, index=idx, now=0, cfg=cfg, rng=rng,
                          cached={"a": 600, "b": 900, "c": 0}, prompt_units=1000, queue_cost=100)
    assert (pick.url, pick.reason, pick.matched_chars) == ("b", "cache_hit", 900)
    # at 300 units per queued request, recomputing 300 units on a is cheaper than waiting on b
    pick = choose_prefill(hashes=[], text_chars=0, workers=views, index=idx, now=0, cfg=cfg, rng=rng,
                          cached={"a": 600, "b": 900, "c": 0}, prompt_units=1000, queue_cost=300)
    assert pick.url == "a"
    # nobody holds enough: the fallback, by load and footprint
    pick = choose_prefill(hashes=[], text_chars=0, workers=views, index=idx, now=0, cfg=cfg, rng=rng,
                          cached={"a": 10, "b": 0, "c": 0}, prompt_units=1000, footprint={"a": 5, "b": 0, "c": 0})
    assert pick.reason == "fallback" and pick.url in ("a", "c", "b")


def test_forget_beyond_and_forget_older() -> None:
    idx = PrefixIndex(block_chars=4)
    a, b = idx.hashes("aaaabbbbcccc"), idx.hashes("xxxxyyyy")
    idx.insert(a, "w", now=1.0)
    idx.insert(b, "w", now=2.0)
    assert idx.forget_beyond(a, "w", keep_chars=4) == 2
    assert idx.match(a, ["w"], now=2.0)["w"] == 4
    assert idx.last_use(b[0], "w") == 2.0
    assert idx.forget_older("w", 1.0) == 1  # a's first block, used at 1.0; b (2.0) stays
    assert idx.match(b, ["w"], now=2.0)["w"] == 8 and len(idx) == 2


@pytest.mark.parametrize(("body", "n"), [
    ({}, 1), ({"n": 3}, 3), ({"sampling_params": {"n": 2}}, 2), ({"sampling_params": [{"n": 1}, {"n": 4}]}, 4),
    ({"n": True}, 1), ({"sampling_params": "x"}, 1),
])
def test_parallel_samples(body: dict, n: int) -> None:
    assert parallel_samples(body) == n
