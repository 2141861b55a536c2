"""The exact index's pure parts: a worker's blocks from events (all-or-nothing batches, the medium kept),
anchors (prompt text blocks -> the worker's token pages) against a radix cache modelled by hand, the
policy's exact path, the predicted index's corrections, `n` of a request."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.kvevents.hashing import block_hashes, pack_bigrams, page_digests
from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer
from infer_ctl.core.routing.anchors import AnchorTable, full_key
from infer_ctl.core.routing.blocks import EventRejected
from infer_ctl.core.routing.index import block_hashes as text_chain
from infer_ctl.core.routing.pd import parallel_samples
from infer_ctl.core.routing.policy import WorkerView, choose_prefill
from infer_ctl.core.routing.units import ScoreInputs
from infer_ctl.router.config import policy_config, router_settings
from tests.router.conftest import new_prefix_index, new_worker_blocks

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
    b = new_worker_blocks()
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
    b = new_worker_blocks(max_blocks=10, max_event_blocks=50_000)
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
    65536 per event) and the worker went untrusted for serving a long prompt."""
    from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder

    rec, build = KvEventRecorder(), KvEventBuilder(1)
    root = _Node([], None)
    node = _Node(list(range(100_000)), root)
    rec.record_store(node)
    events = build.build(rec.take())
    assert len(events) == 1 and len(events[0]["block_hashes"]) == 100_000
    b = new_worker_blocks()
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
    held = new_worker_blocks()
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
    held = new_worker_blocks()
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
    cfg = policy_config(router_settings())
    rng = random.Random(0)
    idx = new_prefix_index()
    views = [WorkerView("a", inflight=0), WorkerView("b", inflight=2), WorkerView("c", inflight=0)]
    # b holds 90 % but has 2 requests queued that each cost 100 units; a holds 60 %: b still wins
    pick = choose_prefill(hashes=[], text_chars=0, workers=views, index=idx, now=0, cfg=cfg, rng=rng,
                          tokens=ScoreInputs({"a": 600, "b": 900, "c": 0}, 1000, 100))
    assert (pick.url, pick.reason, pick.matched_chars) == ("b", "cache_hit", 900)
    # at 300 units per queued request, recomputing 300 units on a is cheaper than waiting on b
    pick = choose_prefill(hashes=[], text_chars=0, workers=views, index=idx, now=0, cfg=cfg, rng=rng,
                          tokens=ScoreInputs({"a": 600, "b": 900, "c": 0}, 1000, 300))
    assert pick.url == "a"
    # nobody holds enough: the fallback, by load and footprint
    pick = choose_prefill(hashes=[], text_chars=0, workers=views, index=idx, now=0, cfg=cfg, rng=rng,
                          tokens=ScoreInputs({"a": 10, "b": 0, "c": 0}, 1000, None), footprint={"a": 5, "b": 0, "c": 0})
    assert pick.reason == "fallback" and pick.url in ("a", "c", "b")


def test_forget_older() -> None:
    idx = new_prefix_index(block_chars=4)
    a, b = idx.hashes("aaaabbbbcccc"), idx.hashes("xxxxyyyy")
    idx.insert(a, "w", now=1.0)
    idx.insert(b, "w", now=2.0)
    assert idx.match(a, ["w"], now=2.0)["w"] == 12
    assert idx.last_use(b[0], "w") == 2.0
    assert idx.forget_older("w", 1.0) == 3  # a's blocks, used at 1.0; b (2.0) stays
    assert idx.match(a, ["w"], now=2.0)["w"] == 0
    assert idx.match(b, ["w"], now=2.0)["w"] == 8 and len(idx) == 2


@pytest.mark.parametrize(("body", "n"), [
    ({}, 1), ({"n": 3}, 3), ({"sampling_params": {"n": 2}}, 2), ({"sampling_params": [{"n": 1}, {"n": 4}]}, 4),
    ({"n": True}, 1), ({"sampling_params": "x"}, 1),
])
def test_parallel_samples(body: dict, n: int) -> None:
    assert parallel_samples(body) == n


def _hicache_events(policy: str = "write_through") -> tuple[object, object, object]:
    """A simulated HiCache radix cache (HBM 100 tokens, host 300, page size 1) whose events are built as
    SGLang's unified tree core records them: a page written through is one BlockStored per medium."""
    from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder
    from infer_ctl.sim.tiers import HiRadixCache, TierConfig

    rec = KvEventRecorder()
    tiers = TierConfig(host_capacity_tokens=300, kv_bytes_per_token=1000, host_bytes_s=1e9,
                       write_policy=policy)  # type: ignore[arg-type]
    return HiRadixCache(100, tiers, events=rec), rec, KvEventBuilder(1)


def test_a_page_in_hbm_and_host_is_one_block_against_max_blocks() -> None:
    """kv_max_blocks counted a write-through page twice (once per medium): a worker holding 120 distinct
    pages (60 in HBM and host, 60 in host only) was "more than 150 blocks" and its stream untrusted."""
    cache, rec, build = _hicache_events()
    b = new_worker_blocks(max_blocks=150)
    b.apply(build.build(rec.take()))  # the reset's AllBlocksCleared
    cache.insert(list(range(1000, 1060)))
    cache.insert(list(range(2000, 2060)))  # 120 > 100 in HBM: the first prompt leaves HBM, stays on host
    events = build.build(rec.take())
    b.apply(events)  # raised EventRejected("capacity") before
    assert b.snapshot() == {"GPU": 60, "CPU_PINNED": 120} and len(b) == 120
    cache.load_back(cache.match_prefix(list(range(1000, 1060))), 1.0)  # back to HBM: still 120 distinct
    b.apply(build.build(rec.take()))
    assert b.snapshot() == {"GPU": 60, "CPU_PINNED": 120} and len(b) == 120
    # what is new on no medium still counts, and a batch passing the bound is refused whole
    with pytest.raises(EventRejected) as exc:
        b.apply([stored(list(range(40)), None, medium="CPU_PINNED")])
    assert exc.value.kind == "capacity" and len(b) == 120
    b.apply([stored(list(range(30)), None, medium="CPU_PINNED"), stored(list(range(30)), None)])
    assert len(b) == 150 and b.snapshot() == {"GPU": 90, "CPU_PINNED": 150}


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_distinct_blocks_follow_every_medium_under_random_load(policy: str) -> None:
    rng = random.Random(policy)
    cache, rec, build = _hicache_events(policy)
    b = new_worker_blocks()
    prefixes = [[rng.randrange(7) for _ in range(rng.randrange(1, 40))] for _ in range(8)]
    for _ in range(400):
        tokens = rng.choice(prefixes) + [rng.randrange(7) for _ in range(rng.randrange(0, 30))]
        m = cache.match_prefix(tokens)
        if m.host and rng.random() < 0.7:
            cache.load_back(m, 1.0)
        cache.insert(tokens)
        if rng.random() < 0.3:
            b.apply(build.build(rec.take()))
        union = set().union(b.device, *b.other.values())
        assert len(b) == len(union)
    assert b.other.get("CPU_PINNED") and len(b) < sum(b.snapshot().values())  # some pages on both media
