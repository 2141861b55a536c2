"""The router's exact KV index against real SGLang 0.5.23's KV events (ZMQ publisher, replay socket):
the cached tokens the index predicts for each request equal what SGLang reports for it
(`--enable-cache-report`: `cached_tokens` in meta_info / usage), for page sizes 16 and 1, both chat
template layouts, collocated and a PD prefill; the index follows a flush (AllBlocksCleared), a server
restart, and a new router replays what the worker holds.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from tests.engine.conftest import Fleet
from tests.engine.engine import EngineServer
from tests.waiting import wait_for

WORDS = ["account", "billing", "policy", "clause", "bank", "fox", "quick", "brown", "lazy", "capital",
         "France", "Paris", "assistant", "every", "applies"]


def _prompt(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _workers(router: RouterHandle) -> dict[str, dict[str, Any]]:
    doc = httpx.get(router.url + "/admin/workers", timeout=5).json()
    return {w["url"]: w for w in doc["workers"]}


def _exact(router: RouterHandle, url: str) -> bool:
    return _workers(router)[url].get("index") == "exact"


def _router_for(fleet: Fleet, which: str) -> tuple[RouterHandle, EngineServer]:
    if which == "prefill":
        p = fleet.prefill
        cfg = router_config(prefill=[(p.url, p.bootstrap_port)], decode=[fleet.decode.url],
                            tokenizer_path=fleet.models.jinja, health_interval_s=0.5, log_requests=True)
        return start_router_in_thread(cfg), p
    server: EngineServer = getattr(fleet, which)
    cfg = router_config(workers=[server.url], tokenizer_path=server.model, health_interval_s=0.5,
                        log_requests=True)
    return start_router_in_thread(cfg), server


def _traffic(router: RouterHandle, seed: int, n: int = 8) -> None:
    """Requests sharing system prompts, half /generate, half chat (the template is the worker's)."""
    rng = random.Random(seed)
    systems = [f"You are assistant {i}. " + _prompt(rng, 120) for i in range(2)]
    with httpx.Client(timeout=120) as c:
        for i in range(n):
            sys_prompt = systems[i % 2]
            if i % 2:
                r = c.post(router.url + "/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, "messages": [
                    {"role": "system", "content": sys_prompt}, {"role": "user", "content": _prompt(rng, 8)}]})
            else:
                r = c.post(router.url + "/generate", json={"text": sys_prompt + " Q: " + _prompt(rng, 8),
                                                           "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200, r.text


def _flush(server: EngineServer) -> None:
    r = server.post("/flush_cache?timeout=20", {})
    assert r.status_code == 200, r.text


@pytest.fixture(params=["colloc", "colloc_p1", "prefill"])
def kv_router(request: pytest.FixtureRequest, engine_fleet: Fleet) -> Iterator[tuple[RouterHandle, EngineServer]]:
    router, server = _router_for(engine_fleet, request.param)
    _flush(server)
    yield router, server
    router.stop()


def test_exact_index_against_sglang_cached_tokens(kv_router: tuple[RouterHandle, EngineServer],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Per request, what the exact index predicted against what SGLang reports. The index is keyed by
    64-character text blocks (core/routing/anchors.py: the request path looks up, tokenizing runs after
    the decision), so a prompt that leaves a shared prefix inside a text block is credited up to that
    block only: never more than the engine finds, at most one text block (~16 of these tokens, rounded
    up to whole pages) less. A prompt sent again is predicted exactly."""
    router, server = kv_router
    assert wait_for(lambda: _exact(router, server.url), timeout=30), _workers(router)[server.url]
    caplog.set_level(logging.INFO, logger="infer_ctl.router")
    _traffic(router, seed=server.page_size)
    repeat = "You are the billing assistant of a bank. " + _prompt(random.Random(5), 60)
    for _ in range(2):
        r = httpx.post(router.url + "/generate", timeout=120, headers={"x-request-id": "repeat"},
                       json={"text": repeat, "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200, r.text
    done = [r for r in caplog.records if r.getMessage() == "request done"]
    assert len(done) == 10
    slack = -(-32 // server.page_size) * server.page_size
    for rec in done:
        predicted, cached = rec.predicted_tokens, rec.cached_tokens  # type: ignore[attr-defined]
        assert 0 <= cached - predicted <= slack, (rec.__dict__, server.name)
    last = done[-1]
    assert last.cached_tokens > 0 and last.predicted_tokens == last.cached_tokens  # type: ignore[attr-defined]
    acc = _workers(router)[server.url]["cached_tokens"]
    assert acc["requests"] == 10 and acc["reported"] > 0 and acc["exact"] >= 0.85 * acc["reported"], acc
    doc = _workers(router)[server.url]
    assert doc["index"] == "exact" and doc["kv_blocks"] > 0
    # a flush: SGLang publishes AllBlocksCleared and the index empties (up to the few tokens the router's
    # own /health probes put back at page size 1: SGLang's /health runs a one-token generation)
    held = doc["kv_blocks"]
    _flush(server)
    assert wait_for(lambda: _workers(router)[server.url]["kv_blocks"] <= (8 if server.page_size == 1 else 0),
                    timeout=15), (held, _workers(router)[server.url])


def test_template_layout_is_read(engine_fleet: Fleet) -> None:
    """The chat_template.jinja layout: the router renders chat prompts with the worker's template (it
    logged 'the model has no chat template' and fell back to the predicted index before)."""
    from infer_ctl.router.kvindex.kv_prompts import view_for

    view, why = view_for({}, engine_fleet.models.jinja)
    assert view is not None and "no chat template" not in why
    assert view.render([{"role": "user", "content": "hi"}]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_replay_and_restart(engine_fleet: Fleet) -> None:
    server = engine_fleet.colloc_p1
    _flush(server)
    first, _ = _router_for(engine_fleet, "colloc_p1")
    try:
        assert wait_for(lambda: _exact(first, server.url), timeout=30)
        _traffic(first, seed=11, n=4)
        held = wait_for(lambda: _workers(first)[server.url]["kv_blocks"], timeout=10)
        assert held
    finally:
        first.stop()
    # a router started now replays the worker's buffered events from seq 0: the same blocks
    second, _ = _router_for(engine_fleet, "colloc_p1")
    try:
        assert wait_for(lambda: _exact(second, server.url) and _workers(second)[server.url]["kv_blocks"] == held,
                        timeout=30), (_workers(second)[server.url], held)
        # the server restarts (a new cache holding only its start-up warm-up request, sequence numbers
        # from 0 again): the index drops what it held, follows the new publisher, and is exact again
        server.restart()

        def followed() -> bool:
            d = _workers(second)[server.url]
            return (d["index"] == "exact" and d["kv_blocks"] < held
                    and sum(st["restarts"] for st in d["kv_streams"]) >= 1)

        assert wait_for(followed, timeout=60), _workers(second)[server.url]
        before = _workers(second)[server.url]["cached_tokens"]
        _traffic(second, seed=12, n=4)
        after = wait_for(lambda: (d := _workers(second)[server.url]["cached_tokens"])["requests"]
                         >= before["requests"] + 4 and d, timeout=10)
        assert after, (before, after)
        reported, exact = after["reported"] - before["reported"], after["exact"] - before["exact"]
        assert reported > 0 and 0.85 * reported <= exact <= reported, (before, after)
    finally:
        second.stop()
