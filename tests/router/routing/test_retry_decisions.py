"""The retry decisions of core/routing/retry.py: the one place the router decides whether, when and where
a failed attempt is retried."""

from __future__ import annotations

import pytest

from infer_ctl.core.routing.retry import (
    attempts,
    backoff_s,
    next_candidates,
    pass_on_answer,
    retryable_status,
)


@pytest.mark.parametrize(("status", "retry"), [(408, True), (429, True), (500, True), (502, True), (503, True),
                                               (504, True), (200, False), (400, False), (404, False), (501, False)])
def test_which_statuses_are_retried(status: int, retry: bool) -> None:
    assert retryable_status(status) is retry


def test_attempts_and_backoff() -> None:
    assert attempts(0) == 1 and attempts(2) == 3
    assert backoff_s(1, 0.5, base_s=0.02) == pytest.approx(0.02)  # rand 0.5: no jitter
    assert backoff_s(3, 0.5, base_s=0.02) == pytest.approx(0.08)
    assert backoff_s(20, 0.5, base_s=0.02) == pytest.approx(1.0)  # capped
    assert backoff_s(1, 0.0, base_s=0.02) == pytest.approx(0.01)  # -50 % jitter


def test_a_retry_prefers_workers_that_have_not_failed_and_falls_back_to_all() -> None:
    pool = ["a", "b", "c"]
    up = {"a": True, "b": True, "c": False}

    def pick(excluded: set[str]) -> list[str]:
        return list(next_candidates(pool, excluded, str, up.__getitem__))

    assert pick(set()) == pool  # a first attempt: the whole pool, availability is the policy's business
    assert pick({"a"}) == ["b"]  # c is down
    assert pick({"a", "b"}) == pool  # nothing else available: the pool rather than nothing


def test_a_later_answer_with_a_body_is_passed_on() -> None:
    assert pass_on_answer(429, b'{"error": "busy"}') and pass_on_answer(408, b"x")
    assert not pass_on_answer(429, b"") and not pass_on_answer(503, b"x")
