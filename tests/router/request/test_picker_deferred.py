"""A decision's bookkeeping after the upstream write (router/request/picker.py `_after_write`): the
prediction, the anchoring's queue and the decision metric run at the loop's next turn, once per decision,
none lost to a step that raises or to a loop that stopped before its turn, and every read of the
predicted index in between sees them (core/routing/index.py `insert_later`)."""

from __future__ import annotations

import asyncio
import random

import pytest

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.router.config import RouterConfig, router_settings, worker
from infer_ctl.router.daemon.assembly import build_router
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.request.retry import AttemptFailed, with_retries

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"
PROMPT = "system: you answer questions about the cluster's billing and deploys. " * 8


def _router() -> Router:
    cfg = RouterConfig(workers=[worker(A, "mixed"), worker(B, "mixed")],
                       settings=router_settings(policy="cache_aware"))
    return build_router(cfg, clock=lambda: 100.0, rng=random.Random(0))


def _ctx(router: Router, text: str = PROMPT) -> RequestContext:
    return RequestContext(rid="r", endpoint="/generate", request=None, raw=b"", body={"text": text},  # type: ignore[arg-type]
                          stream=False, text=text, hashes=router.index.hashes(text), named=None, logprobs=False,
                          started=0.0, headers={})


def _decisions(router: Router) -> float:
    return sum(s.value for m in router.metrics.decisions.collect() for s in m.samples if s.name.endswith("_total"))


def test_a_burst_in_one_turn_follows_its_leader_and_counts_each_decision_once() -> None:
    router = _router()

    async def burst() -> tuple[list[str], int, float, float]:
        router.picker.pick(_ctx(router, "alone " + PROMPT), set())
        blocks = len(router.index)  # the admin API's and the metrics' count, in the pick's turn
        urls = [router.picker.pick(_ctx(router), set())[0].url for _ in range(4)]
        during = _decisions(router)  # deferred: not on the requests' time
        await asyncio.sleep(0)
        return urls, blocks, during, _decisions(router)

    urls, blocks, during, after = asyncio.run(burst())
    assert blocks == len(router.index.hashes("alone " + PROMPT))
    assert len(set(urls)) == 1  # each follower found its leader's prediction, applied before its match
    assert during == 0 and after == 5
    assert router.index.footprint(urls[0]) == len(router.index.hashes(PROMPT)) * router.index.block_chars


def test_a_worker_dropped_in_the_pick_s_turn_keeps_none_of_its_prediction() -> None:
    router = _router()

    async def pick_then_drop() -> str:
        url = router.picker.pick(_ctx(router), set())[0].url
        router.index.drop_worker(url)  # health or admin, later in the same turn
        await asyncio.sleep(0)
        return url

    url = asyncio.run(pick_then_drop())
    assert router.index.footprint(url) == 0 and len(router.index) == 0


def test_a_retry_after_a_failure_before_any_suspension_predicts_each_attempt_s_worker_once() -> None:
    """The first attempt fails at once (no await), the retry goes to the other worker: each attempt's
    prediction is applied for its own worker, once, and each decision counted once."""
    router = _router()
    inserted: list[str] = []
    insert = router.index._insert  # deferred or not, every insert goes through it

    def counted(hashes: list[int], worker: str, now: float) -> None:
        inserted.append(worker)
        insert(hashes, worker, now)

    router.index._insert = counted  # type: ignore[method-assign]
    tried: list[str] = []

    async def attempt(ctx: RequestContext, pre: object, dec: object) -> str:
        url = pre.url  # type: ignore[attr-defined]
        tried.append(url)
        if len(tried) == 1:
            raise AttemptFailed("connect", url, "refused")
        return url

    async def run() -> str:
        got = await with_retries(_ctx(router), router.picker.pick, attempt, max_retries=2, base_s=0.0,
                                 rng=random.Random(0), metrics=router.metrics)
        await asyncio.sleep(0)
        return got

    got = asyncio.run(run())
    assert len(tried) == 2 and tried[0] != tried[1] == got
    assert inserted == tried and _decisions(router) == 2
    full = len(router.index.hashes(PROMPT)) * router.index.block_chars
    assert router.index.match(router.index.hashes(PROMPT), tried, 100.0) == {tried[0]: full, tried[1]: full}


def test_a_raising_step_loses_none_of_the_others() -> None:
    """One step that raises (a metric, the anchoring's queue) is logged; the turn's other decisions'
    steps still run, and the loop goes on."""
    router = _router()
    calls: list[str] = []
    observe = router.metrics.observe_decision

    def flaky(reason: str, seconds: float) -> None:
        calls.append(reason)
        if len(calls) == 1:
            raise RuntimeError("boom")
        observe(reason, seconds)

    router.metrics.observe_decision = flaky  # type: ignore[method-assign]

    async def two() -> None:
        router.picker.pick(_ctx(router), set())
        router.picker.pick(_ctx(router, "other " + PROMPT), set())
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(two())
    assert len(calls) == 2 and _decisions(router) == 1
    assert not router.picker._later


def test_a_loop_stopped_before_its_turn_leaves_nothing_behind() -> None:
    """A pick whose loop stopped (and closed) before the bookkeeping's turn: the next pick, on another
    loop or none, runs it, and the queue does not grow from then on."""
    router = _router()
    loop = asyncio.new_event_loop()

    def pick_and_stop() -> None:
        router.picker.pick(_ctx(router), set())
        loop.stop()

    loop.call_soon(pick_and_stop)
    loop.run_forever()
    loop.close()
    router.picker.pick(_ctx(router), set())  # no loop: at once, with what the stopped loop left
    assert not router.picker._later and _decisions(router) == 2

    async def on_a_new_loop() -> None:
        router.picker.pick(_ctx(router), set())
        await asyncio.sleep(0)

    loop = asyncio.new_event_loop()
    loop.call_soon(pick_and_stop)
    loop.run_forever()
    loop.close()
    asyncio.run(on_a_new_loop())
    assert not router.picker._later and _decisions(router) == 4


def test_without_a_loop_the_bookkeeping_runs_at_once() -> None:
    router = _router()
    url = router.picker.pick(_ctx(router), set())[0].url
    assert _decisions(router) == 1 and not router.index._later
    assert router.index.match(router.index.hashes(PROMPT), [url], 100.0)[url] > 0


def test_a_deferred_insert_that_raises_keeps_the_later_ones() -> None:
    index = PrefixIndex(ttl_s=60.0, max_blocks=100)
    index.insert_later(None, A, 1.0)  # type: ignore[arg-type]
    index.insert_later([1, 2], B, 1.0)
    with pytest.raises(TypeError):
        index.settle()
    assert index.match([1, 2], [B], 1.0) == {B: 2 * index.block_chars}
    assert not index._later


def test_deferred_inserts_apply_in_order_however_many() -> None:
    """In the order deferred (an LRU keeps the last ones), and a long queue (a loop turn's burst)
    applied without one nested call per item."""
    index = PrefixIndex(ttl_s=60.0, max_blocks=10_000)
    index.set_capacity(A, 2)
    for i in range(1, 4):
        index.insert_later([i], A, float(i))
    assert index.match([3], [A], 3.0) == {A: index.block_chars} and index.match([2], [A], 3.0)[A] > 0
    assert index.last_use(1, A) is None
    for i in range(5_000):
        index.insert_later([10_000 + i], B, 4.0)
    assert len(index) == 2 + 5_000
