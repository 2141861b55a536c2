"""An expired (or superseded) pinned named prefix must not stay pinned on the worker.

SGLang 0.5.23 sets a radix node's priority to the max of the priorities of the requests that inserted it
and never lowers it (mem_cache/radix_cache.py `_insert_helper`; matching touches only last_access_time),
and offers no per-prefix eviction (`/flush_cache` drops the whole tree, and only while idle). So a pin
made by priority cannot be undone; the simulator (sim/radix.py) models exactly that. Pins are therefore
kept by touching (control/warmer.py): they age out like any other prefix once they end.
"""

from __future__ import annotations

import httpx

from infer_ctl.router.config import PrefixSpec
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE, new_prefix_registry
from tests.waiting import wait_for

SYSTEM = "You are the support assistant of Example Corp. Follow the policy below. " * 40


def _cached(url: str, text: str) -> int:
    r = httpx.post(url + "/generate", timeout=30, json={"text": text, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 200
    return int(r.json()["meta_info"]["cached_tokens"])


def _traffic(url: str, tokens: int) -> None:
    """Other prompts, ~`tokens` tokens in all (each distinct word is a token of the built-in tokenizer)."""
    sent = 0
    i = 0
    while sent < tokens:
        text = " ".join(f"w{i}x{j}" for j in range(150))
        assert httpx.post(url + "/generate", timeout=30,
                          json={"text": text, "sampling_params": {"max_new_tokens": 1}}).status_code == 200
        sent += 300  # words and the spaces between them
        i += 1


def _expire_then_flood(pin: bool) -> tuple[int, int]:
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=TIME_SCALE, cache_capacity_tokens=3000,
                                                  eviction_policy="priority")])
    worker = cluster.urls[0]
    router = start_router_in_thread(router_config(
        workers=cluster.urls, health_interval_s=0.3,
        prefixes=[PrefixSpec("sys", SYSTEM, ttl_s=2.0, replicas=1, pin=pin)]))
    try:
        def prefix() -> dict:
            return httpx.get(router.url + "/admin/prefixes").json()["prefixes"][0]

        assert wait_for(lambda: any(r["warm"] for r in prefix()["replicas"]), timeout=10)
        held = _cached(worker, SYSTEM)
        assert wait_for(lambda: prefix()["state"] == "expired", timeout=10)
        _traffic(worker, 6000)  # two caches' worth: more than one eviction cycle
        return held, _cached(worker, SYSTEM)
    finally:
        router.stop()
        cluster.stop()


def test_an_expired_pinned_prefix_is_evicted_like_any_other() -> None:
    held, left = _expire_then_flood(pin=True)
    assert held > 500  # it was cached while pinned
    assert left < 0.1 * held, (held, left)


def test_the_unpinned_control_is_evicted_too() -> None:
    held, left = _expire_then_flood(pin=False)
    assert held > 500
    assert left < 0.1 * held, (held, left)


def test_a_pin_is_touched_after_pin_touch_s_idle_and_no_longer_once_it_ended() -> None:
    from infer_ctl.core.routing.policy import WorkerView

    w = [WorkerView("http://p0:1")]
    reg = new_prefix_registry(rewarm_idle_s=100, pin_touch_s=2)
    reg.register("pinned", "A" * 400, now=0, pin=True, ttl_s=10)
    reg.register("plain", "B" * 400, now=0)
    for action in reg.plan_warmups(w, 0):
        reg.warm_done(action, True, 0)
    assert reg.plan_warmups(w, 1) == []
    (touch,) = reg.plan_warmups(w, 2.5)  # the pin only; the plain prefix waits rewarm_idle_s
    assert (touch.name, touch.pin) == ("pinned", True)
    reg.warm_done(touch, True, 2.5)
    reg.tick(11)  # expired: no more touches
    assert [a.name for a in reg.plan_warmups(w, 20)] == []


def test_a_superseded_pin_is_no_longer_touched() -> None:
    from infer_ctl.core.routing.policy import WorkerView

    w = [WorkerView("http://p0:1")]
    reg = new_prefix_registry(rewarm_idle_s=100, pin_touch_s=2)
    reg.register("sys", "A" * 400, now=0, pin=True)
    for action in reg.plan_warmups(w, 0):
        reg.warm_done(action, True, 0)
    reg.register("sys", "B" * 400, now=1, pin=True)  # a new text: v1 superseded
    for action in reg.plan_warmups(w, 1):
        assert action.version == 2
        reg.warm_done(action, True, 1)
    touched = []
    for t in (3.5, 6.0, 9.0):
        for a in reg.plan_warmups(w, t):
            touched.append(a.version)
            reg.warm_done(a, True, t)
    assert touched and set(touched) == {2}  # the new version is touched, the old one never
