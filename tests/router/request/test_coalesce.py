"""The pure part of in-flight prefix coalescing (core/routing/coalesce.py): the pending overlay's depth,
ownership and refcounts, and the hold decision."""

from __future__ import annotations

import pytest

from infer_ctl.core.routing.coalesce import Flight, PendingBlocks, should_hold
from infer_ctl.core.routing.index import block_hashes
from tests.router.conftest import new_coalesce_config

BC = 64


def chain(text: str) -> list[int]:
    return block_hashes(text, BC)


SYSTEM = "s" * (BC * 20)  # 20 shared blocks
A = chain(SYSTEM + "a" * (BC * 3))
B = chain(SYSTEM + "b" * (BC * 3))


def test_depth_is_the_shared_chain_on_that_worker_only() -> None:
    p = PendingBlocks()
    lead = Flight("w1", A)
    p.add(lead, 0)
    assert p.depth("w1", A) == 23
    assert p.depth("w1", B) == 20
    assert p.depth("w2", B) == 0
    assert p.blocks("w1") == 23 and p.snapshot() == {"w1": 23}


def test_leader_is_the_computing_owner_of_the_deepest_shared_block() -> None:
    p = PendingBlocks()
    lead = Flight("w1", A)
    p.add(lead, 0)
    got, n = p.leader("w1", B)
    assert got is lead and n == 20
    # a follower adds its chain: the shared blocks stay the leader's, its own tail is its own
    follower = Flight("w1", B)
    p.add(follower, 0)
    assert p.leader("w1", chain(SYSTEM + "b" * (BC * 3) + "c" * BC))[0] is follower
    assert p.leader("w1", B[:10])[0] is lead
    # landed: nobody computes it any more, nothing to wait for
    lead.land()
    assert p.leader("w1", chain(SYSTEM + "z" * BC)) == (None, 0)


def test_blocks_the_worker_held_are_nobody_s_to_compute() -> None:
    p = PendingBlocks()
    lead = Flight("w1", A)
    p.add(lead, 15)  # the worker held the first 15 blocks at the decision
    got, n = p.leader("w1", B)
    assert got is lead and n == 5  # only 5 shared blocks are being computed


def test_refcounts_keep_the_overlay_prefix_closed() -> None:
    p = PendingBlocks()
    lead, follower = Flight("w1", A), Flight("w1", B)
    p.add(lead, 0)
    p.add(follower, 0)
    p.remove(lead)
    assert p.depth("w1", A) == 20  # the shared blocks stay: the follower still references them
    assert p.depth("w1", B) == 23
    assert p.leader("w1", B[:20]) == (None, 0)  # their computer left
    p.remove(follower)
    p.remove(follower)  # removing twice is harmless
    assert p.depth("w1", B) == 0 and p.snapshot() == {}


def test_a_failed_leader_hands_its_blocks_to_the_next_flight() -> None:
    p = PendingBlocks()
    lead = Flight("w1", A)
    p.add(lead, 0)
    heard: list[str] = []
    lead.on_done = heard.append
    assert lead.fail() and not lead.land()  # one transition only
    assert heard == ["failed"]
    nxt = Flight("w1", B)
    p.add(nxt, 0)
    assert p.leader("w1", A[:20])[0] is nxt  # the shared blocks are the next flight's to compute
    assert p.leader("w1", A) == (None, 0)  # the failed leader's own tail: nobody computes it


def test_should_hold_needs_enough_shared_tokens_being_computed() -> None:
    cfg = new_coalesce_config(min_tokens=256)
    lead = Flight("w1", A)
    assert should_hold(lead, 16, BC, 4.0, cfg)  # 16 blocks x 64 chars / 4 = 256 tokens
    assert not should_hold(lead, 15, BC, 4.0, cfg)
    assert not should_hold(lead, 16, BC, 8.0, cfg)  # 128 tokens at 8 chars a token
    assert not should_hold(None, 100, BC, 4.0, cfg)
    assert not should_hold(lead, 100, BC, 4.0, new_coalesce_config(enabled=False))
    lead.land()
    assert not should_hold(lead, 100, BC, 4.0, cfg)


@pytest.mark.parametrize("kw", [{"min_tokens": 0}, {"max_wait_s": 0}, {"grace_s": -1}])
def test_bad_config_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="coalesce"):
        new_coalesce_config(**kw)


def test_a_failed_leader_hands_its_blocks_over_to_its_followers_first_held_first() -> None:
    """A leader fails with followers held: the first (promoted) takes over the blocks it shares with
    the failed leader (only those: held blocks are nobody's to compute); the next, the failed
    leader's blocks left in its chain; a follower looking past its own tail (`exclude`) finds the one
    computing their shared part."""
    p = PendingBlocks()
    lead = Flight("w1", chain(SYSTEM + "a" * (BC * 3)))
    p.add(lead, 5)  # the worker held the first 5 blocks at the decision: nobody computes those
    f1 = Flight("w1", chain(SYSTEM[: BC * 10]))  # shares 10 blocks with the leader
    f2 = Flight("w1", chain(SYSTEM + "a" + "c" * (BC * 3)))  # shares 20 blocks
    p.add(f1, 5)
    p.add(f2, 5)
    assert p.leader("w1", f2.hashes, exclude=f2) == (lead, 15)
    assert p.leader("w1", f2.hashes, exclude=f2, limit=4) == (lead, 4)
    assert p.leader("w1", f2.hashes)[0] is f2  # without `exclude`: its own tail is the deepest
    lead.fail("client")
    assert lead.cause == "client"
    assert p.hand_over(lead, [f1, f2]) == 15  # 5 to f1, 10 to f2; not the 5 held nor the leader's tail
    p.remove(lead)  # the failed leader leaves after its followers took over
    assert p.leader("w1", f2.hashes, exclude=f2) == (f1, 5)
    assert p.leader("w1", f1.hashes, exclude=f1) == (None, 0)  # nobody computes anything it waits for
    assert p.hand_over(lead, [f1, f2]) == 0  # removed: nothing left to hand over
    f1.land()
    assert p.leader("w1", f2.hashes, exclude=f2) == (None, 0)  # what is left is f2's own


def test_fail_keeps_the_first_cause_only() -> None:
    f = Flight("w1", A)
    assert f.fail("worker") and not f.fail("client")
    assert f.cause == "worker"
    g = Flight("w1", A)
    g.land()
    assert not g.fail("client") and g.cause is None
