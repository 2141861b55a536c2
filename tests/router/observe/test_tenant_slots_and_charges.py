"""A tenant's slot and token charges at the router when requests end early or look odd: a request
cancelled while it waits in the router's admission queue gives its tenant slot back (and ends its trace);
tokens_per_minute reserves at admission, so streams in flight overshoot by one request; hostile bodies
neither leak the slot nor charge what never ran; a streamed batch is charged for every prompt, and a
cancelled or whole stream (chat or /generate) what it streamed or reported, once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from infer_ctl.router.observe.tenants import TenantSpec, key_digest
from infer_ctl.sim.cluster import ThreadedSimCluster, start_cluster_in_thread
from tests.router.conftest import pd_specs
from tests.router.observe.test_tenants import KEY_A, KEY_B, _post, _router


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread(pd_specs(1, 1, time_scale=1.0))  # real-time decode: a long stream stays in flight
    yield c
    c.stop()

SLOW = {"text": "slow " * 8, "stream": True, "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}


def _inflight(url: str, name: str) -> int:
    snap = httpx.get(url + "/admin/tenants", timeout=10).json()
    return next(t["inflight"] for t in snap["tenants"] if t["tenant"] == name)


def test_a_request_cancelled_in_the_admission_queue_gives_its_tenant_slot_back(cluster: ThreadedSimCluster) -> None:
    # the router takes one request at a time; the second waits in its queue, then its client goes away
    router = _router(cluster, [TenantSpec("a", key_digest(KEY_A), max_concurrency=1),
                               TenantSpec("b", key_digest(KEY_B), max_concurrency=5)],
                     max_concurrent=1, queue_timeout_s=30.0)
    try:
        with httpx.stream("POST", router.url + "/generate", json=SLOW, timeout=30,
                          headers={"authorization": f"Bearer {KEY_B}"}) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            next(lines)  # b holds the router's only slot
            try:  # a's request is admitted by its tenant, then queued at the router; the client gives up
                httpx.post(router.url + "/generate", json=SLOW, timeout=0.5,
                           headers={"authorization": f"Bearer {KEY_A}"})
            except httpx.TimeoutException:
                pass
            deadline = time.monotonic() + 5  # b still holds the slot: only the cancel can give a's back
            while _inflight(router.url, "a") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _inflight(router.url, "a") == 0
        assert _post(router.url, KEY_A).status_code == 200  # not refused by a leaked max_concurrency slot
    finally:
        router.stop()


def test_tokens_per_minute_reserves_at_admission_so_streams_in_flight_overshoot_by_one(
        cluster: ThreadedSimCluster) -> None:
    """Before, tokens were charged only when a request ended: every stream opened while the first ones
    were still running was admitted (all 6 here, ~12,000 tokens into a 5,500-token minute)."""
    router = _router(cluster, [TenantSpec("a", key_digest(KEY_A), tokens_per_min=5500)])
    # 10 + 2,000 reserved each; streams long enough to be in flight when the snapshot is read (200-token
    # streams had finished by then on a loaded machine), and a budget that stays negative after the third
    # (5,500 -> 3,490 -> 1,480 -> -530: the refill, 92 tokens/s, cannot reopen it while the test runs)
    body = SLOW
    try:
        with contextlib.ExitStack() as stack:
            codes, open_lines = [], []
            for _ in range(6):
                r = stack.enter_context(httpx.stream("POST", router.url + "/generate", json=body, timeout=30,
                                                     headers={"authorization": f"Bearer {KEY_A}"}))
                codes.append(r.status_code)
                if r.status_code == 200:
                    open_lines.append(r.iter_lines())  # kept: a dropped iterator closes the stream
                    next(open_lines[-1])  # streaming: in flight, nothing reported yet
            assert codes == [200, 200, 200, 429, 429, 429]  # refused from the fourth on
            snap = httpx.get(router.url + "/admin/tenants", timeout=10).json()["tenants"][0]
            assert snap["buckets"]["reserved_tokens"] == 3 * 2010 and snap["rejected"] == {"tokens_per_min": 3}, snap
        deadline = time.monotonic() + 5  # the clients went away: the reservations are settled (kept: computed)
        while _inflight(router.url, "a") and time.monotonic() < deadline:
            time.sleep(0.05)
        snap = httpx.get(router.url + "/admin/tenants", timeout=10).json()["tenants"][0]
        assert snap["inflight"] == 0 and snap["buckets"]["reserved_tokens"] == 0
        assert snap["buckets"]["tokens"] < 500  # 5,500 - 6,030 + the refill: the reservations were kept, not given back
    finally:
        router.stop()


def test_hostile_bodies_neither_leak_the_tenant_slot_nor_charge_what_never_ran(cluster: ThreadedSimCluster) -> None:
    """A 1000-deep `text` list raised RecursionError in the tokens/min estimate after admission (a 500 and
    a max_concurrency slot lost for good); a max_new_tokens over the context, which the worker refuses
    with a 400, kept its 10**9-token reservation (the tenant locked out)."""
    router = _router(cluster, [TenantSpec("a", key_digest(KEY_A), max_concurrency=1, tokens_per_min=6000)])
    auth = {"authorization": f"Bearer {KEY_A}", "content-type": "application/json"}
    try:
        deep = b'{"text":' + b"[" * 1000 + b'"x"' + b"]" * 1000 + b"}"
        r = httpx.post(router.url + "/generate", content=deep, headers=auth, timeout=30)
        assert r.status_code != 500, r.text
        huge = {"text": "hello", "sampling_params": {"max_new_tokens": 10**9}}
        r = httpx.post(router.url + "/generate", json=huge, headers=auth, timeout=30)
        assert r.status_code == 400, r.text
        snap = httpx.get(router.url + "/admin/tenants", timeout=10).json()["tenants"][0]
        assert snap["inflight"] == 0 and snap["buckets"]["tokens"] > 5000, snap
        assert _post(router.url, KEY_A).status_code == 200
    finally:
        router.stop()


def test_a_streamed_batch_is_charged_for_every_prompt(cluster: ThreadedSimCluster) -> None:
    """The relay reported the stream's last event only: one prompt of a streamed /generate batch. Its
    tenant was charged 50 of 200 output tokens here, and given the other prompts' reservation back."""
    router = _router(cluster, [TenantSpec("a", key_digest(KEY_A), tokens_per_min=600_000)])
    body = {"text": ["hello a", "hello b", "hello c", "hello d"], "stream": True,
            "sampling_params": {"max_new_tokens": 20, "ignore_eos": True}}
    try:
        with httpx.stream("POST", router.url + "/generate", json=body, timeout=60,
                          headers={"authorization": f"Bearer {KEY_A}"}) as r:
            assert r.status_code == 200
            assert sum(1 for line in r.iter_lines() if line.startswith("data: {")) >= 4
        deadline = time.monotonic() + 5
        while _inflight(router.url, "a") and time.monotonic() < deadline:
            time.sleep(0.05)
        snap = httpx.get(router.url + "/admin/tenants", timeout=10).json()["tenants"][0]
        assert snap["output_tokens"] == 4 * 20 and snap["input_tokens"] >= 4, snap
    finally:
        router.stop()


CHAT = {"messages": [{"role": "user", "content": "hi"}], "stream": True}  # no max_tokens: reserves its prompt only


def _tenant(url: str) -> dict:
    return httpx.get(url + "/admin/tenants", timeout=10).json()["tenants"][0]


def _settled(url: str) -> dict:
    deadline = time.monotonic() + 5
    while _inflight(url, "a") and time.monotonic() < deadline:
        time.sleep(0.05)
    return _tenant(url)


def test_a_chat_stream_cancelled_before_its_usage_is_charged_what_it_streamed() -> None:
    """A chat request without max_tokens reserves its prompt (1 token here); cancelled after 20 deltas,
    before the usage chunk, it kept only that reservation: the streamed completion was free (the bucket
    stayed at 59 of 60, and the tenant could go on doing it)."""
    slow = start_cluster_in_thread(pd_specs(1, 1, time_scale=0.1))  # ~6 s for the 128 tokens: cancelled mid-way
    router = _router(slow, [TenantSpec("a", key_digest(KEY_A), tokens_per_min=60)])  # refills 1 token/s
    try:
        t0 = time.monotonic()
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=CHAT, timeout=30,
                          headers={"authorization": f"Bearer {KEY_A}"}) as r:
            assert r.status_code == 200
            events = (line for line in r.iter_lines() if line.startswith("data: {"))
            for _ in range(20):
                assert '"usage"' not in next(events)
        snap = _settled(router.url)
        elapsed = time.monotonic() - t0
        assert snap["output_tokens"] == 0, snap  # cancelled before the usage chunk: nothing reported
        assert snap["inflight"] == 0 and snap["buckets"]["reserved_tokens"] == 0, snap
        # 60 - 1 (prompt) - >= 20 counted deltas (the router forwarded at least what the client read)
        # + the refill while the test ran
        assert snap["buckets"]["tokens"] <= 60 - 1 - 20 + elapsed + 0.5, (snap, elapsed)
    finally:
        router.stop()
        slow.stop()


def test_a_whole_chat_stream_is_charged_its_reported_usage_once(cluster: ThreadedSimCluster) -> None:
    router = _router(cluster, [TenantSpec("a", key_digest(KEY_A), tokens_per_min=60)])
    try:
        t0 = time.monotonic()
        body = {**CHAT, "max_tokens": 30}
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=30,
                          headers={"authorization": f"Bearer {KEY_A}"}) as r:
            assert r.status_code == 200
            assert any('"usage"' in line for line in r.iter_lines())
        snap = _settled(router.url)
        elapsed = time.monotonic() - t0
        used = snap["input_tokens"] + snap["output_tokens"]
        assert snap["output_tokens"] == 30 and snap["buckets"]["reserved_tokens"] == 0, snap
        # charged exactly the usage: not the event count on top of it
        assert 60 - used - 0.5 <= snap["buckets"]["tokens"] <= 60 - used + elapsed + 0.5, (snap, elapsed)
    finally:
        router.stop()


def test_a_generate_stream_cancelled_is_charged_its_running_completion_count(cluster: ThreadedSimCluster) -> None:
    """/generate streams carry meta_info.completion_tokens on every chunk: a cancelled one is charged
    that when it is more than its reservation (here max_new_tokens=2000 reserved: it keeps that)."""
    router = _router(cluster, [TenantSpec("a", key_digest(KEY_A), tokens_per_min=6000)])
    try:
        with httpx.stream("POST", router.url + "/generate", json=SLOW, timeout=30,
                          headers={"authorization": f"Bearer {KEY_A}"}) as r:
            lines = (line for line in r.iter_lines() if line.startswith("data: {"))
            for _ in range(5):
                next(lines)
        snap = _settled(router.url)
        assert snap["buckets"]["reserved_tokens"] == 0 and snap["buckets"]["tokens"] < 6000 - 2000 + 60, snap
    finally:
        router.stop()
