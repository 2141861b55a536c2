"""What a routing decision that finds no worker says (router/request/picker.py): the 503's Retry-After only when
the router knows when a request could be served (every worker the request needs that is out is held by
flap damping, router/control/health.py), in PD mode over both roles; a half-open prefill's probe slot given back
when no decode is found; a retry that goes back to the worker that failed rather than to nothing."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from infer_ctl.core.routing.policy import NoWorkerAvailable
from infer_ctl.router.config import RouterConfig, router_settings, worker
from infer_ctl.router.daemon.assembly import build_router
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.request.context import RequestContext
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.request.retry import AttemptFailed, with_retries

P, D, A, B = "http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3", "http://127.0.0.1:4"


def _router(*specs: tuple[str, Any]) -> tuple[Router, list[float]]:
    now = [100.0]
    cfg = RouterConfig(workers=[worker(u, role) for u, role in specs],
                       settings=router_settings(policy="round_robin", cb_open_s=5.0))
    return build_router(cfg, clock=lambda: now[0], rng=random.Random(0)), now


def _ctx() -> RequestContext:
    return RequestContext(rid="r", endpoint="/generate", request=None, raw=b"", body={"text": "hi"},  # type: ignore[arg-type]
                          stream=False, text="hi", hashes=[], named=None, logprobs=False, started=0.0, headers={})


def _hold(w: WorkerState, now: float, holddown_s: float) -> None:
    """Out on a flap with `holddown_s` to serve, answering its checks since `now`."""
    w.healthy = False
    w.flap.readmit(now - 10)
    w.flap.eject(now - 1, base_s=holddown_s, cap_s=holddown_s, stable_s=60.0)
    w.flap.checked(True, now)


def _down(w: WorkerState) -> None:
    """Out without a hold-down (a first ejection): back on its next passing checks."""
    w.healthy = False


def _refused(router: Router, excluded: set[str] | None = None) -> NoWorkerAvailable:
    with pytest.raises(NoWorkerAvailable) as info:
        router.picker.pick(_ctx(), excluded or set())
    return info.value


def test_a_held_prefill_beside_a_down_decode_gives_no_retry_after() -> None:
    """Back in 30 s says the prefill; the decode the request needs as well may be back any moment or
    never: after 30 s the client got a plain 503. Nobody knows when the pair is back."""
    router, now = _router((P, "prefill"), (D, "decode"))
    _hold(router.workers.by_url[P], now[0], 30.0)
    _down(router.workers.by_url[D])
    exc = _refused(router)
    assert "1 answering but held down by flap damping" in str(exc) and "back in 30 s" in str(exc)
    assert exc.retry_after_s is None


def test_a_held_prefill_and_a_decode_held_longer_wait_for_both() -> None:
    router, now = _router((P, "prefill"), (D, "decode"))
    _hold(router.workers.by_url[P], now[0], 10.0)
    _hold(router.workers.by_url[D], now[0], 30.0)
    assert _refused(router).retry_after_s == 30  # not 10: then the decode still refuses


def test_a_held_prefill_beside_a_serving_decode_gives_its_hold_down() -> None:
    router, now = _router((P, "prefill"), (D, "decode"))
    _hold(router.workers.by_url[P], now[0], 30.0)
    assert _refused(router).retry_after_s == 30
    router2, now2 = _router((P, "prefill"), (D, "decode"))
    _hold(router2.workers.by_url[D], now2[0], 20.0)
    assert _refused(router2).retry_after_s == 20  # the decode side held, the prefill serving


def test_a_held_worker_beside_one_down_without_a_hold_down_gives_no_retry_after() -> None:
    """B may be back on its next probe (a second): a Retry-After of A's 30 s kept clients away for nothing."""
    router, now = _router((A, "mixed"), (B, "mixed"))
    _hold(router.workers.by_url[A], now[0], 30.0)
    _down(router.workers.by_url[B])
    exc = _refused(router)
    assert "1 answering but held down" in str(exc) and exc.retry_after_s is None
    _hold(router.workers.by_url[B], now[0], 50.0)  # both held: the first back is known
    assert _refused(router).retry_after_s == 30


def test_a_draining_worker_is_not_named_as_coming_back() -> None:
    """Drained by the operator (POST /admin/workers/drain), it takes nothing when its hold-down ends."""
    router, now = _router((A, "mixed"),)
    w = router.workers.by_url[A]
    _hold(w, now[0], 30.0)
    w.draining = True
    exc = _refused(router)
    assert str(exc) == "no available worker" and exc.retry_after_s is None


def test_a_half_open_prefill_is_not_left_holding_its_probe_when_no_decode_is_found() -> None:
    """The prefill's breaker half-opens at the decision that then finds no decode: its one probe slot was
    taken for a request never sent, and every later request found no prefill, the decode back or not,
    until the prefill's next readmission."""
    router, now = _router((P, "prefill"), (D, "decode"))
    pre, dec = router.workers.by_url[P], router.workers.by_url[D]
    for _ in range(router.cfg.settings.cb_failures):
        pre.breaker.record(False, now[0])
    now[0] += router.cfg.settings.cb_open_s  # open for its cb_open_s: the next request probes it
    _down(dec)
    _refused(router)
    dec.healthy = True
    got_pre, got_dec = router.picker.pick(_ctx(), set())
    assert (got_pre, got_dec) == (pre, dec)


def test_a_retry_goes_back_to_the_worker_that_failed_when_the_others_are_out() -> None:
    """A failed (a 503 under load), B down: the retry went to nothing, and the client got a 502 after one
    attempt of the three it is allowed, as it does not where A is alone in the fleet."""
    router, _ = _router((A, "mixed"), (B, "mixed"))
    _down(router.workers.by_url[B])
    assert router.picker.pick(_ctx(), {A})[0].url == A
    tried: list[str] = []

    async def attempt(ctx: RequestContext, pre: WorkerState, dec: WorkerState | None) -> str:
        tried.append(pre.url)
        if len(tried) == 1:
            raise AttemptFailed("status", pre.url, "HTTP 503", 503, b"")
        return "ok"

    got = asyncio.run(with_retries(_ctx(), router.picker.pick, attempt, max_retries=2, base_s=0.0,
                                   rng=random.Random(0), metrics=router.metrics))
    assert got == "ok" and tried == [A, A]


def test_a_prefill_with_a_good_pair_that_is_out_does_not_refuse_the_request() -> None:
    """P2's pair is fine but P2 is down; P1's only pair failed its pair test. Preferring P2 for its pair
    left the picker nothing: 503, where docs/router.md says avoiding is never refusing."""
    router, now = _router((P, "prefill"), (A, "prefill"), (D, "decode"))
    router.pairs.health.push(P, D, "fail", "pair test", now[0])
    _down(router.workers.by_url[A])
    pre, dec = router.picker.pick(_ctx(), set())
    assert (pre.url, dec and dec.url) == (P, D)
    assert router.pairs.avoided == 0  # nothing avoided: the only prefill that can serve was used


def test_a_decode_with_a_good_pair_that_is_out_does_not_refuse_the_request() -> None:
    router, now = _router((P, "prefill"), (D, "decode"), (B, "decode"))
    router.pairs.health.push(P, B, "fail", "pair test", now[0])
    _down(router.workers.by_url[D])
    pre, dec = router.picker.pick(_ctx(), set())
    assert (pre.url, dec and dec.url) == (P, B)
    assert router.pairs.fallbacks == 1  # a degraded pair used, as when every pair of the prefill is
