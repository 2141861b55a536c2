"""Tokens per minute with a reservation at admission (core/tenancy/estimate.py, router/observe/tenants.py,
router/request/observe.py): requests in flight at once can overshoot the bucket by one request, not by all of
them; each is settled with its reported usage when it ends. Real Tenancy and Observing objects on a
clock the test moves; the estimate's numbers are exact for given bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from infer_ctl.core.tenancy.buckets import TokenBucket
from infer_ctl.core.tenancy.estimate import request_tokens
from infer_ctl.router.observe.tenants import Tenancy, TenantSpec
from infer_ctl.router.request.observe import Observing, RequestObserver

HEADERS = {"x-inferctl-tenant": "t"}


@pytest.mark.parametrize(("endpoint", "body", "tokens"), [
    ("/generate", {"text": "x" * 400, "sampling_params": {"max_new_tokens": 50}}, 100 + 50),
    ("/generate", {"text": "x" * 400}, 100 + 128),  # SGLang's default max_new_tokens
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "n": 3}}, 3 + 3 * 2),
    ("/generate", {"text": ["x" * 40, "y" * 80], "sampling_params": [{"max_new_tokens": 5}, {"max_new_tokens": 7}]},
     30 + 2 * 7),
    ("/v1/completions", {"prompt": "x" * 40}, 10 + 16),  # SGLang's CompletionRequest max_tokens
    ("/v1/completions", {"prompt": [[1, 2], [3, 4, 5]], "max_tokens": 4, "n": 2}, 5 + 2 * 2 * 4),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40},
                                           {"role": "user", "content": [{"type": "text", "text": "y" * 40}]}],
                              "max_completion_tokens": 9, "max_tokens": 100}, 20 + 9),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 40}]}, 10),  # no limit: prompt only
    ("/generate", ["not", "an", "object"], 0),
])
def test_the_estimate_is_prompt_plus_the_request_s_limit(endpoint: str, body: Any, tokens: int) -> None:
    assert request_tokens(endpoint, body, 4.0) == tokens


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _observing(tpm: int, clock: Clock) -> Observing:
    tenancy = Tenancy([TenantSpec("t", tokens_per_min=tpm)], header="x-inferctl-tenant", worker_usd_per_s={},
                      clock=clock, registry=CollectorRegistry())
    return Observing(tenancy, None, model_name=None, chars_per_token=lambda: 4.0)


def _start(o: Observing, body: dict[str, Any]) -> RequestObserver | None:
    obs, refusal = o.start(HEADERS, "/generate", "rid", json.dumps(body).encode())
    return obs if refusal is None else None


def _answer(obs: RequestObserver, prompt: int, completion: int) -> None:
    obs.sent = True  # its calls went through the observer (observe.py _begin)
    obs.answered(None, {"meta_info": {"prompt_tokens": prompt, "cached_tokens": 0,  # type: ignore[arg-type]
                                      "completion_tokens": completion}}, 0)


def test_requests_in_flight_at_once_overshoot_by_one_request_at_most() -> None:
    """Before: nothing was charged until a request ended, so all 10 were admitted into a 1,000-token
    minute and used 3,000."""
    clock = Clock()
    o = _observing(1000, clock)
    body = {"text": "x" * 800, "sampling_params": {"max_new_tokens": 100}}  # 200 + 100 = 300 reserved
    admitted = [obs for obs in (_start(o, body) for _ in range(10)) if obs is not None]
    assert len(admitted) == 4  # 1000 -> 700 -> 400 -> 100 -> -200: the fifth is refused
    tenant = admitted[0].tenant
    assert tenant is not None and tenant.tpm is not None and tenant.reserved == 1200
    assert tenant.rejected == {"tokens_per_min": 6}
    for obs in admitted:  # each used what it reserved
        _answer(obs, 200, 100)
        obs.finish(200)
    used = 4 * 300
    assert used - 1000 <= 300  # the overshoot: one request
    assert tenant.reserved == 0 and tenant.tpm.level == pytest.approx(1000 - used)


def test_settling_charges_the_excess_and_gives_back_the_rest() -> None:
    clock = Clock()
    o = _observing(1000, clock)
    a = _start(o, {"text": "x" * 400, "sampling_params": {"max_new_tokens": 100}})  # 200 reserved
    b = _start(o, {"text": "x" * 400, "sampling_params": {"max_new_tokens": 100}})
    assert a is not None and b is not None and a.tenant is not None and a.tenant.tpm is not None
    bucket: TokenBucket = a.tenant.tpm
    assert bucket.level == 600
    _answer(a, 100, 20)  # stopped early: 80 of its 200 back
    a.finish(200)
    assert bucket.level == 680
    _answer(b, 300, 100)  # the estimate was low: 200 more charged
    b.finish(200)
    assert bucket.level == 480 and a.tenant.output_tokens == 120 and a.tenant.input_tokens == 400


def test_failures_keep_the_reservation_once_a_worker_was_reached_and_give_it_back_otherwise() -> None:
    clock = Clock()
    o = _observing(1000, clock)
    body = {"text": "x" * 400, "sampling_params": {"max_new_tokens": 100}}  # 200
    never_sent, cancelled = _start(o, body), _start(o, body)
    assert never_sent is not None and cancelled is not None and never_sent.tenant is not None
    bucket = never_sent.tenant.tpm
    assert bucket is not None and bucket.level == 600
    never_sent.finish(503)  # no worker available: nothing computed
    assert bucket.level == 800
    cancelled.sent = True
    cancelled.finish(499)  # the client went away mid-stream: the worker computed, no usage reported
    assert bucket.level == 800 and never_sent.tenant.reserved == 0
    bad = o.start(HEADERS, "/generate", "rid", b"{not json")[0]
    assert bad is not None and bad.reserved == 0  # the proxy answers it 400


def test_a_refill_never_goes_above_capacity_when_given_back() -> None:
    b = TokenBucket(rate=1.0, capacity=100.0, now=0.0)
    b.charge(0.0, 50.0)
    b.credit(10.0, 50.0)  # 50 + 10 refill + 50 back: capped
    assert b.level == 100.0


def test_a_deeply_nested_prompt_is_estimated_without_recursion() -> None:
    """A 1000-deep list (valid JSON for orjson) raised RecursionError in the estimate, after the tenant's
    admission: the request was a 500 and its max_concurrency slot was never given back."""
    import orjson

    from infer_ctl.core.tenancy.estimate import request_tokens

    for endpoint, field in (("/generate", "text"), ("/generate", "input_ids"), ("/v1/completions", "prompt")):
        doc = orjson.loads(b'{"%s":' % field.encode() + b"[" * 1000 + b"1" + b"]" * 1000 + b"}")
        assert request_tokens(endpoint, doc, 4.0) >= 0
    assert request_tokens("/generate", {"text": ["x" * 40, [1, 2], "y" * 8]}, 4.0) == 10 + 2 + 2 + 3 * 128


def test_a_request_a_worker_refused_gets_its_reservation_back() -> None:
    """A 400 from the worker (SGLang: max_tokens over the context) computed nothing; it kept a reservation
    of its max_tokens, so one request with a huge max_tokens locked the tenant out."""
    clock = Clock()
    o = _observing(1000, clock)
    huge = _start(o, {"text": "x" * 400, "sampling_params": {"max_new_tokens": 10**12}})
    assert huge is not None and huge.tenant is not None and huge.tenant.tpm is not None
    huge.sent = True
    huge.finish(400)
    assert huge.tenant.tpm.level == 1000 and huge.tenant.reserved == 0
    again = _start(o, {"text": "x" * 400, "sampling_params": {"max_new_tokens": 100}})
    assert again is not None  # admitted: not in a 10**12-token debt
