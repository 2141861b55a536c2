"""PD request fields, logprob merge, routing text, breaker and backoff (pure)."""

from __future__ import annotations

import random

import pytest

from infer_ctl.core.routing.breaker import BreakerState, CircuitBreaker
from infer_ctl.core.routing.pd import (
    ROOM_MAX,
    batch_size,
    bootstrap_host,
    merge_input_logprobs,
    with_bootstrap,
)
from infer_ctl.core.routing.prompt import routing_text
from infer_ctl.core.routing.retry import backoff_s
from tests.router.conftest import new_breaker


@pytest.mark.parametrize(
    ("endpoint", "body", "n"),
    [
        ("/generate", {"text": "a"}, None),
        ("/generate", {"text": ["a", "b", "c"]}, 3),
        ("/generate", {"input_ids": [[1, 2], [3]]}, 2),
        ("/generate", {"input_ids": [1, 2, 3]}, None),
        ("/v1/completions", {"prompt": ["a", "b"]}, None),  # OpenAI endpoints take scalars
        ("/v1/chat/completions", {"messages": [], "n": 2}, None),
    ],
)
def test_batch_size_table(endpoint: str, body: dict, n: int | None) -> None:
    assert batch_size(endpoint, body) == n


def test_rooms_are_random_nonzero_and_leave_room_for_batch_offsets() -> None:
    rng = random.Random(0)
    rooms = [with_bootstrap({"text": "x"}, "/generate", "10.0.0.1", 8998, rng)["bootstrap_room"] for _ in range(2000)]
    assert all(1 <= r < ROOM_MAX for r in rooms) and len(set(rooms)) == len(rooms)
    assert ROOM_MAX + 1023 < 2**63


def test_batches_get_lists_with_one_fresh_room_each() -> None:
    body = with_bootstrap({"text": ["a", "b"], "bootstrap_room": 0}, "/generate", "h", 8998, random.Random(1))
    assert body["bootstrap_host"] == ["h", "h"] and body["bootstrap_port"] == [8998, 8998]
    assert len(set(body["bootstrap_room"])) == 2 and 0 not in body["bootstrap_room"]


def test_client_sent_pd_fields_are_replaced_and_input_untouched() -> None:
    orig = {"text": "x", "bootstrap_room": 0, "bootstrap_host": "evil"}
    body = with_bootstrap(orig, "/generate", "h", None, random.Random(2))
    assert body["bootstrap_host"] == "h" and body["bootstrap_room"] != 0 and body["bootstrap_port"] is None
    assert orig["bootstrap_room"] == 0


@pytest.mark.parametrize(
    ("url", "host"),
    [("http://10.0.0.11:30000", "10.0.0.11"), ("http://[fd00::1]:30000", "[fd00::1]"), ("http://pf-01:1", "pf-01")],
)
def test_bootstrap_host_from_url(url: str, host: str) -> None:
    assert bootstrap_host(url) == host


def test_merge_input_logprobs_single_and_batch() -> None:
    pre = {"meta_info": {"input_token_logprobs": [[None, 1, None], [-0.5, 2, None]]}}
    dec = {"meta_info": {"input_token_logprobs": [[-0.1, 3, None]], "output_token_logprobs": [[-1, 4, None]]}}
    out = merge_input_logprobs(pre, dec)
    assert out["meta_info"]["input_token_logprobs"] == [[None, 1, None], [-0.5, 2, None], [-0.1, 3, None]]
    batch = merge_input_logprobs([pre, pre], [{"meta_info": {}}, {"meta_info": {}}])
    assert all(len(d["meta_info"]["input_token_logprobs"]) == 2 for d in batch)


@pytest.mark.parametrize(
    ("endpoint", "body", "text"),
    [
        ("/generate", {"text": "hello"}, "hello"),
        ("/generate", {"text": ["first", "second"]}, "first"),
        ("/generate", {"input_ids": [5, 6]}, "5,6,"),
        ("/v1/completions", {"prompt": "p"}, "p"),
        ("/v1/chat/completions",
         {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": [{"type": "text", "text": "U"}]}]},
         "S\n<|system|>\nU\n<|user|>\n"),
        ("/generate", {}, ""),
    ],
)
def test_routing_text_table(endpoint: str, body: dict, text: str) -> None:
    assert routing_text(endpoint, body) == text


def test_chat_routing_text_covers_the_whole_conversation() -> None:
    turn1 = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"}]}
    turn2 = {"messages": [*turn1["messages"], {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]}
    t1, t2 = routing_text("/v1/chat/completions", turn1), routing_text("/v1/chat/completions", turn2)
    assert t2.startswith(t1) and len(t2) > len(t1)


def test_breaker_open_half_open_close() -> None:
    cb = CircuitBreaker(failure_threshold=3, success_threshold=2, open_s=10)
    for _ in range(2):
        cb.record(False, now=0)
    assert cb.state is BreakerState.CLOSED
    cb.record(True, now=0)  # a success resets the consecutive count
    for _ in range(3):
        cb.record(False, now=1)
    assert cb.state is BreakerState.OPEN and not cb.allows(5) and not cb.acquire(5)
    assert cb.allows(11) and cb.acquire(11) and cb.state is BreakerState.HALF_OPEN
    assert not cb.acquire(11)  # one probe at a time
    cb.record(True, now=11)
    assert cb.acquire(11)
    cb.record(True, now=11)
    assert cb.state is BreakerState.CLOSED


def test_breaker_half_open_failure_reopens() -> None:
    cb = new_breaker(failure_threshold=1, open_s=1)
    cb.record(False, now=0)
    assert cb.acquire(2)
    cb.record(False, now=2)
    assert cb.state is BreakerState.OPEN and cb.opened_at == 2


@pytest.mark.parametrize(("attempt", "rand", "expected"), [(1, 0.5, 0.02), (2, 0.5, 0.04), (3, 0.0, 0.04), (20, 1.0, 1.5)])
def test_backoff_is_exponential_capped_and_jittered(attempt: int, rand: float, expected: float) -> None:
    assert backoff_s(attempt, rand, base_s=0.02) == pytest.approx(expected)
