"""The replay's sequence rules (router/kvindex/replay_cursor.py), without sockets."""

from __future__ import annotations

from infer_ctl.router.kvindex.replay_cursor import END_SEQ, ReplayCursor
from tests.router.conftest import new_replay_cursor


def feed(cur: ReplayCursor, seqs: list[int]) -> list[str]:
    out = []
    for s in seqs:
        step = cur.message(s)
        out.append(f"{step.kind}{step.seq}" if step.kind in ("apply", "ask") else step.kind)
    return out


def test_a_whole_answer_is_applied_in_order_and_its_end_marker_ends_it() -> None:
    cur = new_replay_cursor(0, None)
    assert feed(cur, [0, 1, 2, END_SEQ]) == ["apply0", "apply1", "apply2", "done"]
    assert cur.last == 2 and cur.requests == 1


def test_a_hole_inside_an_answer_is_asked_again_from_the_missing_seq() -> None:
    """The issue's "cannot replay from seq 0: the worker's buffer starts at seq 1016, after 1000": the
    publisher's ROUTER dropped what did not fit; the rest of that answer is skipped, the new one fills it."""
    cur = new_replay_cursor(0, None)
    first = [*range(0, 1000), 1016, 1017, END_SEQ]
    got = feed(cur, first)
    assert got[999] == "apply999" and got[1000] == "ask1000" and got[1001:] == ["skip", "skip"]
    assert feed(cur, [*range(1000, 1020), END_SEQ])[-1] == "done"
    assert cur.last == 1019 and cur.gaps == 1 and cur.requests == 2


def test_a_buffer_that_really_starts_later_fails_after_the_bounded_asks() -> None:
    cur = new_replay_cursor(0, None, gap_asks=2)
    assert feed(cur, [5, 6, END_SEQ]) == ["ask0", "skip", "skip"]
    assert feed(cur, [5, END_SEQ]) == ["ask0", "skip"]
    step = cur.message(5)
    assert step.kind == "fail" and step.why == "the worker's buffer starts at seq 5, after 0 (2 requests again)"


def test_already_applied_batches_and_late_answers_are_skipped() -> None:
    cur = new_replay_cursor(10, 12)  # a gap replay from 10 on a stream that applied up to 12 meanwhile
    assert feed(cur, [10, 11, 12, 13, END_SEQ]) == ["skip", "skip", "skip", "apply13", "done"]


def test_timeouts_ask_again_with_doubling_waits_then_fail() -> None:
    cur = new_replay_cursor(0, None, attempts=3, timeout_s=0.1)
    assert [cur.wait_s, cur.timeout().kind, cur.wait_s, cur.timeout().kind, cur.wait_s] == [0.1, "ask", 0.2, "ask", 0.4]
    step = cur.timeout()
    assert step.kind == "fail" and step.why == "no replay answer within 0.7s (3 requests)"


def test_a_replay_has_its_own_batch_budget() -> None:
    cur = new_replay_cursor(0, None, max_batches=3)
    assert feed(cur, [0, 1, 2])[-1] == "apply2"
    step = cur.message(3)
    assert step.kind == "fail" and "more than 3 batches in one replay" in step.why


def test_holes_further_on_each_get_their_own_asks() -> None:
    """A 10,000-batch buffer through a 1,000-message pipe: every answer may have a hole, each further
    on. Bounded to `gap_asks` holes per replay, 1 restart in 5 failed ("the worker's buffer starts at seq
    8153, after 8011 (3 requests again)"); the bound is per missing seq."""
    cur = new_replay_cursor(0, None, gap_asks=2)
    assert feed(cur, [*range(0, 10), 12, END_SEQ])[-2:] == ["ask10", "skip"]
    assert feed(cur, [*range(10, 20), 25, END_SEQ])[-2:] == ["ask20", "skip"]
    assert feed(cur, [*range(20, 30), 31, END_SEQ])[-2:] == ["ask30", "skip"]
    assert feed(cur, [*range(30, 40), END_SEQ])[-1] == "done"
    assert cur.last == 39 and cur.gaps == 3
