"""core/tenancy: token buckets, the share clock and a worker's price (exact values for given inputs)."""

from __future__ import annotations

import pytest

from infer_ctl.core.sizing.cost import node_hour_price
from infer_ctl.core.tenancy.buckets import TokenBucket, retry_after_s
from infer_ctl.core.tenancy.pricing import RolePrice, servers, worker_usd_per_s
from infer_ctl.core.tenancy.shares import ShareClock


def test_request_bucket_takes_a_burst_then_refills_at_its_rate() -> None:
    b = TokenBucket(rate=2.0, capacity=3.0, now=0.0)
    assert [b.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert b.wait_s(0.0, 1.0) == pytest.approx(0.5)
    assert retry_after_s(b.wait_s(0.0, 1.0)) == 1
    assert not b.take(0.4) and b.take(0.5)  # 0.5 s x 2/s = one token
    assert b.refill(100.0) == 3.0  # never above its capacity


def test_token_bucket_is_charged_afterwards_and_refuses_while_in_debt() -> None:
    b = TokenBucket(rate=10.0, capacity=100.0, now=0.0)  # 600 tokens per minute
    assert b.allows(0.0)
    b.charge(0.0, 250.0)  # one request used more than the whole bucket: in debt
    assert b.level == -150.0 and not b.allows(0.0)
    assert b.wait_s(0.0) == pytest.approx(15.0, abs=1e-6)
    assert retry_after_s(b.wait_s(0.0)) == 16  # ceil(15 + epsilon): after it, the bucket admits
    assert not b.allows(15.0) and b.allows(15.1)


def test_bucket_needs_a_rate_and_a_size() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, capacity=1.0, now=0.0)


def test_share_clock_splits_time_between_requests_in_flight_and_conserves_it() -> None:
    c = ShareClock(now=0.0)
    a = c.enter(1.0)  # 0..1 idle
    b = c.enter(2.0)  # 1..2 a alone
    share_a = c.leave(4.0, a)  # 2..4 shared by two
    share_b = c.leave(5.0, b)  # 4..5 b alone
    c.advance(7.0)  # 5..7 idle
    assert share_a == pytest.approx(1.0 + 1.0)
    assert share_b == pytest.approx(1.0 + 1.0)
    assert c.idle_s == pytest.approx(3.0)
    assert share_a + share_b + c.idle_s == pytest.approx(7.0)  # the whole lease, nothing lost or doubled


def test_worker_price_from_the_lease_pricing_of_plan_cost() -> None:
    # the architecture's decode pool: 6 nodes of 8x H200 at $3.50 per GPU-hour, one tp-8 server per node
    dec = RolePrice("decode", gpus_per_node=8, nodes=6, tp=8, gpu_hour_usd=3.5)
    assert node_hour_price(gpus_per_node=8, gpu_hour_usd=3.5) == 28.0
    assert servers(dec) == 6
    assert worker_usd_per_s(dec) == pytest.approx(28.0 / 3600)
    # tp 16 spans two 8-GPU nodes: 4 nodes make 2 servers, each pays for two nodes
    wide = RolePrice("prefill", gpus_per_node=8, nodes=4, tp=16, node_hour_usd=20.0)
    assert servers(wide) == 2 and worker_usd_per_s(wide) == pytest.approx(40.0 / 3600)
    # tp 4 on an 8-GPU node: inferctl runs one server per role and node, which pays for the whole node
    narrow = RolePrice("prefill", gpus_per_node=8, nodes=2, tp=4, node_hour_usd=20.0)
    assert servers(narrow) == 2 and worker_usd_per_s(narrow) == pytest.approx(20.0 / 3600)
    with pytest.raises(ValueError, match="exactly one"):
        node_hour_price(gpus_per_node=8, node_hour_usd=1.0, gpu_hour_usd=1.0)
