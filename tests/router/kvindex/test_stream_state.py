"""The live stream's sequence rules and rate limits (router/kvindex/stream_state.py), without sockets
(issue 27): gaps, replays, restarts, dropped connections, floods."""

from __future__ import annotations

from infer_ctl.router.kvindex.replay_cursor import END_SEQ
from infer_ctl.router.kvindex.stream_state import ByteRate, FloodWindow, StreamSequence
from tests.router.conftest import new_replay_cursor


def synced(last: int | None = None) -> StreamSequence:
    """A stream whose start-up replay from 0 ended with `last` applied (None: an empty buffer)."""
    s = StreamSequence()
    assert s.take_replay() == (True, 0) and s.take_replay() == (False, None)
    base = s.replay_begins(0)
    if last is not None:
        s.replay_applies(0)
        s.applied(last)
    s.replayed(0, base)
    return s


def kinds(s: StreamSequence, seqs: list[int]) -> list[str]:
    out = []
    for q in seqs:
        step = s.live(q)
        out.append(step.kind)
        if step.kind == "apply":
            s.applied(q)
    return out


def test_a_new_stream_replays_from_zero_before_it_trusts_anything() -> None:
    s = StreamSequence()
    assert s.state == "replaying" and s.ignores_live(has_replay=True)
    assert not s.ignores_live(has_replay=False)  # no replay socket: live batches are all there is
    s = synced()
    assert s.exact and s.last_seq == -1 and kinds(s, [0, 1, 2]) == ["apply"] * 3


def test_live_copies_of_replayed_batches_are_skipped_then_a_lower_seq_is_a_restart() -> None:
    s = synced(last=4)  # the replay applied 0..4; their live copies are still queued
    assert kinds(s, [3, 4, 5, 6]) == ["skip", "skip", "apply", "apply"]
    assert s.live(2).kind == "restart"  # past the replayed range: going back means a new publisher


def test_a_gap_replays_from_the_missing_seq_and_untrusts_when_the_replay_falls_short() -> None:
    s = synced(last=4)
    step = s.live(9)
    assert step.kind == "gap" and step.seq == 5
    base = s.replay_begins(step.seq)
    cur = new_replay_cursor(step.seq, s.last_seq)
    for q in (5, 6, 7, 8):
        assert cur.message(q).kind == "apply"
        s.replay_applies(q)
        s.applied(q)
    assert cur.message(END_SEQ).kind == "done"
    s.replayed(step.seq, base)
    assert s.exact and s.after_replay(9) == "apply"

    short = synced(last=4)
    short.replay_begins(5)
    short.applied(6)
    short.replayed(5, 4)
    assert short.after_replay(9) == "gap"  # 7 and 8 never came: the caller untrusts the stream
    assert short.after_replay(5) == "none"  # the replay had it


def test_a_restarted_publisher_is_applied_from_zero_or_replayed_from_zero() -> None:
    s = synced(last=10)
    assert kinds(s, [0, 11]) == ["skip", "apply"]  # 0: a queued live copy of what the replay applied
    assert s.live(0).kind == "restart" and s.restart_at(0) and s.last_seq == -1
    s.applied(0)  # (the caller applies it)
    assert kinds(s, [1]) == ["apply"]
    s = synced(last=10)
    assert kinds(s, [11]) == ["apply"]
    assert s.live(3).kind == "restart" and not s.restart_at(3) and s.last_seq is None


def test_restart_and_down_reset_the_sequence() -> None:
    s = synced(last=7)
    s.down("worker unhealthy")
    assert s.state == "down" and s.last_seq is None and s.ignores_live(has_replay=False)
    assert s.take_replay() == (False, None)  # a down worker is not replayed
    s.restarted("worker healthy again")
    assert s.state == "replaying" and s.take_replay() == (True, 0)


def test_untrusted_reads_only_for_a_clear_and_a_repair_makes_it_exact_again() -> None:
    s = synced(last=3)
    assert s.untrusted("capacity") and not s.untrusted("again")  # counted once
    assert kinds(s, [4, 5, 100]) == ["repair"] * 3
    s.repaired(100)
    assert s.exact and s.last_seq == 100 and kinds(s, [101]) == ["apply"]


def test_a_dropped_connection_replays_what_followed_on_the_next_subscription() -> None:
    s = synced(last=12)
    s.dropped()
    assert s.state == "replaying" and s.take_replay() == (True, 13) and s.take_replay() == (False, None)
    u = synced(last=12)
    u.untrusted("flood")
    u.dropped()  # an untrusted stream has nothing to replay into
    assert u.state == "untrusted" and u.take_replay() == (False, None)


def test_a_replay_due_while_the_stream_stopped_replaying_is_moot() -> None:
    s = synced(last=2)
    s.dropped()
    s.untrusted("gap")
    assert s.take_replay() == (True, None)  # the live receive still stops; nothing is replayed


def test_no_replay_endpoint_trusts_a_fresh_stream_only() -> None:
    s = StreamSequence()
    assert s.replay_without_endpoint(0) and s.exact and kinds(s, [0]) == ["apply"]
    assert s.live(5).kind == "gap" and not s.replay_without_endpoint(1)
    late = StreamSequence()
    assert late.replay_without_endpoint(0) and late.live(7).kind == "no_history"


def test_flood_window_counts_batches_and_bytes_per_second_and_starts_over_after_a_flood() -> None:
    f = FloodWindow(max_batches_per_s=3, max_bytes_per_s=1000)
    assert [f.over(10, 100.0 + i * 0.1) for i in range(3)] == [None, None, None]
    assert f.over(10, 100.3) == "more than 3 batches/s"
    assert f.over(10, 100.4) is None  # the window started over at the flood
    assert f.over(600, 101.5) is None and f.over(500, 101.6) == "more than 1000 bytes/s"
    assert f.over(900, 102.7) is None  # a new second


def test_byte_rate_is_a_one_second_budget() -> None:
    r = ByteRate(100, now=0.0)
    assert not r.over(60, 0.1) and r.over(60, 0.5) and not r.over(60, 1.2)
