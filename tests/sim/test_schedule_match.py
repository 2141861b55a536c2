"""The simulator matches a prompt against its radix cache when the prompt enters a prefill batch, as
SGLang does (Scheduler.get_new_batch_prefill: init_next_round_input, then PrefillAdder.add_one_req),
not when it arrives: a request queued behind the cold prefill of its prefix hits it, two requests of a
new prefix in one batch both compute it (fcfs), a chunked prefill's computed part is in the tree for
later requests (cache_unfinished_req), cached_tokens is what the request skipped, locks stay balanced."""

from __future__ import annotations

import asyncio
import dataclasses
import random

import httpx

from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.engine import Engine, SimRequest
from infer_ctl.sim.radix import Node, RadixCache
from infer_ctl.sim.tiers import HiRadixCache, TierConfig
from infer_ctl.sim.timing import resolve_timing

PREFIX = list(range(10_000, 10_900))  # 900 tokens


def _engine(budget: int, cache: RadixCache | None = None) -> tuple[Engine, list[int]]:
    """A mixed worker with a prefill budget of `budget` tokens per forward; the list collects the
    tokens each prefill forward computed."""
    timing = dataclasses.replace(resolve_timing(speculative=False), chunked_prefill_size=budget)
    computed: list[int] = []
    seconds = timing.prefill_seconds

    def counting(tokens: int) -> float:
        computed.append(tokens)
        return seconds(tokens)

    object.__setattr__(timing, "prefill_seconds", counting)
    return Engine("mixed", timing, cache or RadixCache(1_000_000), time_scale=0.001, seed=0), computed


def _prompt(tag: int, n: int = 100) -> list[int]:
    return PREFIX + [tag * 1000 + i for i in range(n)]


async def _run(engine: Engine, prompts: list[list[int]], max_new: int = 2) -> list[SimRequest]:
    engine.start()
    try:
        reqs = [engine.new_request(f"r{i}", p, max_new) for i, p in enumerate(prompts)]
        for r in reqs:
            engine.submit_prefill(r)
        for r in reqs:
            while await r.updates.get() is not None:
                pass
        return reqs
    finally:
        await engine.stop()


def _locks(cache: RadixCache) -> list[int]:
    out: list[int] = []
    stack: list[Node] = [cache.root]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is not cache.root:
            out.append(node.lock_ref)
    return out


def test_a_request_queued_behind_the_cold_prefill_of_its_prefix_hits_it() -> None:
    # the first prompt fills the whole budget, so the second one waits for the next batch, when the
    # first one's prefill is in the tree; matched at arrival (before the fix) it computed all 1000 tokens
    engine, computed = _engine(budget=1000)
    a, b = asyncio.run(_run(engine, [_prompt(1), _prompt(2)]))
    assert a.cached_tokens == 0
    assert b.cached_tokens == len(PREFIX)
    assert computed == [1000, 100]
    assert engine.metrics.cached_tokens == len(PREFIX)


def test_two_requests_of_a_new_prefix_in_one_batch_both_compute_it() -> None:
    # fcfs does no in-batch de-duplication: both requests were matched before either was inserted
    engine, computed = _engine(budget=8192)
    a, b = asyncio.run(_run(engine, [_prompt(1), _prompt(2)]))
    assert (a.cached_tokens, b.cached_tokens) == (0, 0)
    assert computed == [2000]


def test_a_later_request_matches_the_computed_chunks_of_a_chunked_prefill() -> None:
    # 400-token chunks: after the first chunk of the first prompt (its first 400 prefix tokens) is in the
    # tree, the second prompt, admitted in the third forward, hits what the first has computed by then
    engine, computed = _engine(budget=400)
    a, b = asyncio.run(_run(engine, [_prompt(1), _prompt(2)]))
    assert a.cached_tokens == 0
    assert computed[:3] == [400, 400, 400]
    # forward 3 = a's last 200 + b's first 200 uncached tokens; b matched the 800 tokens a had computed
    assert b.cached_tokens == 800
    assert sum(computed) == 2 * 1000 - b.cached_tokens


def test_cached_tokens_is_what_each_request_skipped_and_locks_are_balanced_after_a_burst() -> None:
    rng = random.Random(7)
    prefixes = [list(range(k * 5000, k * 5000 + rng.randrange(200, 1500))) for k in range(1, 6)]
    prompts = [rng.choice(prefixes) + [rng.randrange(10**6, 2 * 10**6) for _ in range(rng.randrange(1, 300))]
               for _ in range(120)]
    for cache in (RadixCache(6000), HiRadixCache(6000, TierConfig(host_capacity_tokens=20_000,
                                                                  kv_bytes_per_token=1, host_bytes_s=1e9))):
        engine, computed = _engine(budget=1024, cache=cache)
        reqs = asyncio.run(_run(engine, prompts, max_new=1))
        # every prompt token was either cached (reported once, in cached_tokens) or computed
        assert sum(computed) == sum(r.prompt_tokens - r.cached_tokens for r in reqs)
        assert engine.metrics.cached_tokens == sum(r.cached_tokens for r in reqs) > 0
        assert cache.locked == 0 and set(_locks(cache)) <= {0}
        assert all(r.lock_node is None for r in reqs)


def test_meta_info_reports_the_hit_of_a_request_that_waited_behind_its_prefix() -> None:
    # a real worker over HTTP: the first prompt takes a whole forward (budget = its length), the second,
    # sent while that forward runs, is matched after the first one's prefill went into the tree
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=1.0, speculative=False,
                                                  chunked_prefill_size=1000, prefill_mfu=0.05)])
    url = cluster.workers[0].url
    try:
        with httpx.Client(timeout=30) as client:
            first = {"input_ids": _prompt(1), "sampling_params": {"max_new_tokens": 1}}
            second = {"input_ids": _prompt(2), "sampling_params": {"max_new_tokens": 1}}

            async def both() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=30) as ac:
                    t1 = asyncio.create_task(ac.post(url + "/generate", json=first))
                    await asyncio.sleep(0.1)  # the first forward is running (~0.36 s at this mfu)
                    t2 = asyncio.create_task(ac.post(url + "/generate", json=second))
                    return [await t1, await t2]

            r1, r2 = asyncio.run(both())
            # whichever reached the worker first computed the prefix (the budget keeps the other out of its
            # batch, however late the sleep wakes on a loaded machine); the other skipped it
            cached = sorted(r.json()["meta_info"]["cached_tokens"] for r in (r1, r2))
            assert cached == [0, len(PREFIX)]
            assert client.get(url + "/v1/loads").json()["loads"][0]["num_waiting_reqs"] == 0
    finally:
        cluster.stop()


# -- a chunk's own insert and the eviction it triggers -------------------------------------------------
def test_a_chunk_insert_does_not_evict_the_chunk_it_just_inserted() -> None:
    # SGLang's cache_unfinished_req inserts the chunk and locks its new last node before anything can be
    # evicted (eviction runs at the next allocation): the request's own computed KV is never evictable.
    # Inserting first and locking after let the insert's own eviction pick the fresh, low-priority leaf
    cache = RadixCache(100, policy="priority")
    cache.insert(list(range(1000, 1060)), priority=10)  # another, higher-priority, unlocked entry
    prompt = list(range(80))
    first = cache.insert_locked(prompt[:40], 0, cache.root)
    second = cache.insert_locked(prompt[:80], 0, first)
    assert cache.match_prefix(prompt).length == 80  # the request's two chunks are in the tree
    depth, node = 0, second
    while node is not cache.root:
        assert node.parent is not None
        depth, node = depth + len(node.key), node.parent
    assert depth == 80  # and its lock covers both
    assert cache.match_prefix(list(range(1000, 1060))).length == 0  # the other entry made the room
    cache.unlock(second)
    assert cache.locked == 0


def test_a_chunked_prefill_under_cache_pressure_stores_each_page_once_chained_and_never_removes_it() -> None:
    # KV events across chunks: every page of the prompt is stored exactly once (chunk ends that are not
    # page-aligned store the whole pages only), each store chained to the page before it, and nothing of
    # the running request is removed while the other (higher-priority) entry is evictable
    from infer_ctl.core.kvevents.hashing import block_hashes, page_digests
    from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder

    ps = 16
    recorder = KvEventRecorder()
    cache = RadixCache(1504, policy="priority", page_size=ps, events=recorder)
    cache.insert(list(range(50_000, 51_000)), priority=5)
    recorder.take()
    engine, computed = _engine(budget=410, cache=cache)
    prompt = list(range(1, 1201))
    (req,) = asyncio.run(_run(engine, [prompt]))
    assert computed == [410, 410, 380]
    events = KvEventBuilder(ps).build(recorder.take())
    mine = block_hashes(page_digests(prompt, ps, None))
    stored = [e for e in events if e["type"] == "BlockStored"]
    removed = {h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]}
    assert [h for e in stored for h in e["block_hashes"]] == mine  # once each, in order
    for e in stored:  # chained: each store's parent is the page before its first
        i = mine.index(e["block_hashes"][0])
        assert e["parent_block_hash"] == (mine[i - 1] if i else None)
    assert not removed & set(mine)
    assert cache.locked == 0 and req.cached_tokens == 0


def test_a_prefill_step_matches_only_the_requests_its_budget_admits_however_long_the_queue() -> None:
    # 1,000 waiting prompts of 2,000 tokens, 4,096-token forwards: each step matches (and so touches the
    # tree for) the three requests it admits, not the queue; a step's work stays O(batch)
    engine, computed = _engine(budget=4096)
    calls: list[int] = []
    match = engine.cache.match_prefix

    def counting(tokens: list[int], priority: int = 0) -> object:
        calls.append(len(tokens))
        return match(tokens, priority)

    engine.cache.match_prefix = counting  # type: ignore[method-assign,assignment]

    async def first_steps() -> list[int]:
        engine.start()
        try:
            reqs = [engine.new_request(f"r{i}", list(range(i * 10_000, i * 10_000 + 2000)), 1) for i in range(1000)]
            for r in reqs:
                engine.submit_prefill(r)
            while len(computed) < 3:
                await asyncio.sleep(0)
            return [len(calls), sum(r.started is not None for r in reqs)]
        finally:
            await engine.stop()

    matched, started = asyncio.run(first_steps())
    assert started <= 7 and matched == started  # 3 forwards of 4,096 tokens: at most 7 prompts begun
    assert engine.cache.locked == 0


def test_under_lru_the_prefix_of_a_queued_request_is_refreshed_before_the_batch_evicts() -> None:
    # SGLang 0.5.23's calc_priority (SchedulePolicy._touch_waiting_prefixes, SGLANG_ENABLE_WAITING_PREFIX_
    # REFRESH on by default): every 32nd scheduling pass, under lru, the cached prefixes of the first 128
    # waiting requests are touched, so a queued request's prefix is not the first evicted while it waits
    # to be matched. Here the prefix P was cached before Q; the first forward's prompt (the whole budget)
    # must evict one of them: with the refresh it is Q, and the request queued behind hits P
    for policy, hit in (("lru", len(PREFIX)), ("priority", 0)):  # SGLang refreshes under lru only
        cache = RadixCache(2000, policy=policy)  # type: ignore[arg-type]
        cache.insert(PREFIX)
        cache.insert(list(range(50_000, 51_000)))  # Q, touched after P
        engine, computed = _engine(budget=1000, cache=cache)
        first, waiting = asyncio.run(_run(engine, [list(range(60_000, 61_000)), _prompt(1)]))
        assert computed[0] == 1000 and first.cached_tokens == 0
        assert waiting.cached_tokens == hit, policy


def test_waiting_uncached_tokens_estimates_unmatched_prompts_with_the_recent_hit_rate() -> None:
    # SGLang 0.5.23's SchedulerLoadInquirer.get_num_waiting_uncached_tokens under fcfs (the waiting queue
    # is not prefix-matched): a waiting request counts int(seqlen x (1 - recent cache hit rate)), the
    # hit rate of the prefill batches of the last 15 s (hit / (hit + computed)); the chunked request
    # counts exactly what it has left. Counting the whole prompt overstated a warm worker's queue
    engine, _ = _engine(budget=1000)

    async def scenario() -> tuple[int, int]:
        for prompt in (_prompt(1), _prompt(2)):  # 0 of 1000 cached, then 900 of 1000
            await _run(engine, [prompt])
        assert engine.recent_cache_hit_rate == 900 / 2000
        waiting = engine.new_request("w", list(range(70_000, 72_000)), 1)
        engine.submit_prefill(waiting)  # the loop is stopped: it stays queued, unmatched
        before = engine.waiting_uncached_tokens()
        chunked = engine.new_request("c", list(range(80_000, 80_500)), 1)
        chunked.started, chunked.remaining_prefill = 1.0, 123  # as a request mid-chunk
        engine.prefill_queue.appendleft(chunked)
        return before, engine.waiting_uncached_tokens()

    before, after = asyncio.run(scenario())
    assert before == int(2000 * (1 - 0.45))
    assert after == before + 123
