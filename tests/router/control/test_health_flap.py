"""Flap damping of the active health checks (router/control/health.py, core/routing/flap.py): a worker that goes
unhealthy again soon after it was let back is held out for a hold-down that doubles with each flap in a
row (capped), still probed and let back once it answered every check for the hold-down; a first
ejection, or one after a stable period, has none. Real loopback workers (simulated SGLang servers, and
a small one that crashes and restarts on demand), the module's constants made small."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.core.routing.flap import FlapDamper
from infer_ctl.router.config import router_settings
from infer_ctl.router.control import health
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.router.standin_http import StandinServer
from tests.waiting import wait_for

EJECTED = "worker unhealthy: dropped its prefix-index entries"
BACK = "worker healthy again"


def test_the_hold_down_doubles_per_flap_up_to_its_cap_and_a_stable_worker_starts_over() -> None:
    f = FlapDamper()
    kw = {"base_s": 1.0, "cap_s": 5.0, "stable_s": 60.0}
    assert f.eject(0.0, **kw) == 0.0 and f.admits(0.0)  # first ejection: none
    holds = []
    t = 0.0
    for _ in range(5):
        f.readmit(t)
        t += 10.0  # down again 10 s after it came back: a flap
        holds.append(f.eject(t, **kw))
    assert holds == [1.0, 2.0, 4.0, 5.0, 5.0] and f.flaps == 5 and f.ejections == 6
    # the hold-down runs while it answers; a failed check starts it over
    assert not f.admits(t + 100) and f.left_s(t + 100) == 5.0  # never answered yet
    f.checked(True, t + 1)
    f.checked(True, t + 5)
    assert f.left_s(t + 5) == 1.0 and not f.admits(t + 5)
    f.checked(False, t + 5.5)
    f.checked(True, t + 6)
    assert not f.admits(t + 10) and f.admits(t + 11)
    f.readmit(t + 11)
    f.settle(t + 70, 60.0)
    assert f.flaps == 5  # 59 s up: not stable yet
    f.settle(t + 71, 60.0)
    assert f.flaps == 0
    assert f.eject(t + 80, **kw) == 0.0  # a first ejection again
    f.readmit(t + 81)
    assert f.eject(t + 82, **kw) == 1.0
    # cap 0: damping off
    g = FlapDamper()
    g.readmit(0.0)
    assert g.eject(1.0, base_s=1.0, cap_s=0.0, stable_s=60.0) == 0.0 and g.admits(1.0)


def test_a_crash_loop_of_thousands_of_flaps_keeps_its_cap() -> None:
    """2.0 ** 1024 overflows: the 1025th flap in a row raised out of HealthChecker.apply half-way through
    the ejection (no connections dropped, no index forgotten), with damping off (cap 0) as much as on."""
    for cap in (0.0, 60.0):
        f = FlapDamper()
        t = 0.0
        for _ in range(1100):
            f.readmit(t)
            t += 1.0
            assert f.eject(t, base_s=1.0, cap_s=cap, stable_s=60.0) == (cap if f.flaps > 6 or cap == 0 else
                                                                        min(cap, 2.0 ** (f.flaps - 1)))
        assert f.flaps == 1100 and f.holddown_s == cap


def records(caplog: pytest.LogCaptureFixture, msg: str, url: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == msg and getattr(r, "worker", None) == url]


def test_a_worker_that_fails_once_is_back_as_fast_as_without_damping(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(health, "DOWN_PROBE_S", 0.1)
    monkeypatch.setattr(health, "HOLDDOWN_BASE_S", 3.0)  # a hold-down by mistake would show
    caplog.set_level(logging.WARNING, logger="infer_ctl.router.health")
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.1, speculative=False) for _ in range(2)])
    router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=30.0, health_failures=1,
                                                  policy="round_robin", retry_base_s=0.01))
    try:
        url = cluster.urls[1]
        w = router.router.workers.by_url[url]
        assert wait_for(lambda: w.instance is not None, timeout=5)  # the first round answered
        cluster.stop_worker(1)
        router.loop.call_soon_threadsafe(router.server.health.suspect, w)  # as a request's transport error would
        assert wait_for(lambda: not w.healthy, timeout=5)
        cluster.start_worker(1)
        t0 = time.monotonic()
        assert wait_for(lambda: w.healthy, timeout=5)
        assert time.monotonic() - t0 < 1.5  # the next probe, 0.1 s, not a 3 s hold-down
        assert [r.holddown_s for r in records(caplog, EJECTED, url)] == [0.0]  # type: ignore[attr-defined]
        assert [r.checks for r in records(caplog, BACK, url)] == [1]  # type: ignore[attr-defined]
        assert w.flap.flaps == 0 and w.flap.ejections == 1
    finally:
        router.stop()
        cluster.stop()


def test_a_flapping_worker_is_held_down_longer_each_time_probed_meanwhile(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A crash loop of a real (simulated) SGLang server: stopped, restarted on its port with a new start
    time, four times. Hold-downs 0, 0.25, 0.5, then 0.6 (the cap instead of 1.0)."""
    monkeypatch.setattr(health, "DOWN_PROBE_S", 0.05)
    monkeypatch.setattr(health, "HOLDDOWN_BASE_S", 0.25)
    caplog.set_level(logging.WARNING, logger="infer_ctl.router.health")
    cluster = start_cluster_in_thread([WorkerSpec("mixed", time_scale=0.1, speculative=False) for _ in range(2)])
    router = start_router_in_thread(router_config(workers=cluster.urls, health_interval_s=0.2, health_failures=1,
                                                  health_holddown_max_s=0.6, policy="round_robin"))
    try:
        url = cluster.urls[1]
        w = router.router.workers.by_url[url]
        assert wait_for(lambda: w.instance is not None, timeout=5)
        waited = []
        for hold in (0.0, 0.25, 0.5, 0.6):
            cluster.stop_worker(1)
            assert wait_for(lambda: not w.healthy, timeout=5)
            cluster.start_worker(1)
            t0 = time.monotonic()  # it answers from here on
            assert wait_for(lambda: w.healthy, timeout=5, every=0.01)
            waited.append(time.monotonic() - t0)
            # its first passing check, at or after t0, started the hold-down: never let back sooner
            assert waited[-1] >= hold - 0.02, (hold, waited)
            assert waited[-1] < hold + 1.5, (hold, waited)
        ejected = records(caplog, EJECTED, url)
        assert [r.holddown_s for r in ejected] == [0.0, 0.25, 0.5, 0.6]  # type: ignore[attr-defined]
        assert [r.flaps for r in ejected] == [0, 1, 2, 3]  # type: ignore[attr-defined]
        # held, it was still probed: let back on its 2nd passing check or later, a first ejection on its 1st
        checks = [r.checks for r in records(caplog, BACK, url)]  # type: ignore[attr-defined]
        assert checks[0] == 1 and all(c >= 2 for c in checks[1:]), checks
        assert w.restarts == 4 and w.flap.ejections == 4 and w.flap.flaps == 3
    finally:
        router.stop()
        cluster.stop()


class Crashy:
    """A worker that crashes and restarts on demand: while down its /health answers 503 (as SGLang's
    does while its scheduler does not answer), each restart gives /server_info a new startup_time.
    Counts the /health requests."""

    def __init__(self) -> None:
        self.up = True
        self.start = 1.0
        self.checks = 0
        self.server = StandinServer(self._answer)
        self.url = self.server.url

    def _answer(self, path: str) -> tuple[int, bytes]:
        if path == "/health":
            self.checks += 1
            return (200 if self.up else 503), b"{}"
        if path == "/server_info":
            return 200, json.dumps({"startup_time": self.start}).encode()
        return 200, b"{}"

    def crash(self) -> None:
        self.up = False

    def restart(self) -> None:
        self.start += 1
        self.up = True

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def crashies() -> Iterator[list[Crashy]]:
    made = [Crashy(), Crashy()]
    yield made
    for c in made:
        c.close()


def flap(w: Any, c: Crashy, times: int) -> None:
    """Crash and restart `c` `times` times, each time once the router saw it down and let it back."""
    for _ in range(times):
        c.crash()
        assert wait_for(lambda: not w.healthy, timeout=5)
        c.restart()
        assert wait_for(lambda: w.healthy, timeout=5)


def test_a_worker_stable_for_the_period_is_let_back_at_once_again(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture,
                                                                  crashies: list[Crashy]) -> None:
    monkeypatch.setattr(health, "DOWN_PROBE_S", 0.05)
    monkeypatch.setattr(health, "HOLDDOWN_BASE_S", 0.5)
    monkeypatch.setattr(health, "FLAP_STABLE_S", 0.8)
    caplog.set_level(logging.WARNING, logger="infer_ctl.router.health")
    c = crashies[0]
    router = start_router_in_thread(router_config(workers=[c.url], health_interval_s=0.1, health_failures=1))
    try:
        w = router.router.workers.by_url[c.url]
        assert wait_for(lambda: w.instance is not None, timeout=5)
        flap(w, c, 3)  # hold-downs 0, 0.5, 1.0
        assert [r.holddown_s for r in records(caplog, EJECTED, c.url)] == [0.0, 0.5, 1.0]  # type: ignore[attr-defined]
        # healthy for the stable period: its flaps are forgotten (shown at once, not at the next ejection)
        assert wait_for(lambda: w.flap.flaps == 0, timeout=5)
        assert time.time() - records(caplog, BACK, c.url)[-1].created >= 0.8 - 0.02  # not sooner
        c.crash()
        assert wait_for(lambda: not w.healthy, timeout=5)
        c.restart()
        t0 = time.monotonic()
        assert wait_for(lambda: w.healthy, timeout=5, every=0.01)
        assert time.monotonic() - t0 < 1.0  # a first ejection again: no hold-down (2 s had it flapped)
        assert records(caplog, EJECTED, c.url)[-1].holddown_s == 0.0  # type: ignore[attr-defined]
        assert records(caplog, BACK, c.url)[-1].checks == 1  # type: ignore[attr-defined]
    finally:
        router.stop()


def held_router(monkeypatch: pytest.MonkeyPatch, crashies: list[Crashy]) -> RouterHandle:
    """Both workers flapped once and restarted: held down for 30 s (far longer than the test)."""
    monkeypatch.setattr(health, "DOWN_PROBE_S", 0.05)
    monkeypatch.setattr(health, "HOLDDOWN_BASE_S", 30.0)
    router = start_router_in_thread(router_config(workers=[c.url for c in crashies], health_interval_s=0.1,
                                                  health_failures=1))
    for c in crashies:
        hold_one(router.router.workers.by_url[c.url], c)
    return router


def hold_one(w: Any, c: Crashy) -> None:
    assert wait_for(lambda: w.instance is not None, timeout=5)
    flap(w, c, 1)  # a first ejection: back at once
    c.crash()
    assert wait_for(lambda: not w.healthy, timeout=5)
    assert w.flap.holddown_s == 30.0
    c.restart()
    assert wait_for(lambda: w.flap.answering_since is not None, timeout=5)


def test_a_held_worker_is_probed_and_shown_held_until_it_is_removed(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str],
                                                                    crashies: list[Crashy]) -> None:
    router = held_router(monkeypatch, crashies)
    try:
        a, b = crashies
        w = router.router.workers.by_url[a.url]
        n = a.checks
        assert wait_for(lambda: a.checks >= n + 3, timeout=5)  # still probed, every DOWN_PROBE_S
        assert not w.healthy and w.health_successes >= 3
        doc = {d["url"]: d for d in httpx.get(router.url + "/admin/workers", timeout=5).json()["workers"]}
        row = doc[a.url]
        assert row["held"] is True and row["holddown_s"] == 30.0 and 25 < row["holddown_left_s"] <= 30
        assert row["flaps"] == 1 and row["ejections"] == 2 and row["healthy"] is False
        assert httpx.get(router.url + "/admin/status", timeout=5).json()["workers"]["held"] == 2
        metrics = httpx.get(router.url + "/metrics", timeout=5).text
        assert f'inferctl_router_worker_holddown_seconds{{role="mixed",worker="{a.url}"}} 30.0' in metrics
        assert f'inferctl_router_worker_ejections_total{{role="mixed",worker="{a.url}"}} 2.0' in metrics
        # every worker held: the 503 says they answer but are held, and for how long, not just "none"
        r = httpx.post(router.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 1}, timeout=5)
        msg = r.json()["error"]["message"]
        assert r.status_code == 503 and re.search(r"2 answering but held down by flap damping.* back in (29|30) s", msg), msg
        assert r.headers["retry-after"] in ("29", "30")  # when the first is back: what a client should wait
        main(["router", "workers", "--url", router.url])
        out = capsys.readouterr().out
        assert re.search(r"held (29|30)s", out), out  # what is left of the 30 s
        # removed while held: no probe of it any more, and never let back
        r = httpx.post(router.url + "/admin/workers/remove", json={"url": a.url}, timeout=5)
        assert r.status_code == 200
        checking = router.server.health._checking
        assert wait_for(lambda: a.url not in checking, timeout=5)
        n = a.checks
        m = b.checks
        assert wait_for(lambda: b.checks >= m + 5, timeout=5)  # the other one's probes went on meanwhile
        assert a.checks == n and not w.healthy and w.removed
    finally:
        router.stop()


def test_stopping_a_router_with_held_workers_is_prompt(monkeypatch: pytest.MonkeyPatch,
                                                       crashies: list[Crashy]) -> None:
    router = held_router(monkeypatch, crashies)
    hc = router.server.health
    t0 = time.monotonic()
    router.stop()
    assert time.monotonic() - t0 < 3.0  # not the hold-down's 30 s: nothing waits on it
    assert not hc._probes and hc._task is not None and hc._task.done()
    n = [c.checks for c in crashies]
    time.sleep(0.3)  # six probe periods: none came
    assert [c.checks for c in crashies] == n


def test_the_cap_comes_from_the_profile_and_is_a_finite_number_of_seconds() -> None:
    from infer_ctl.errors import ProfileError, UsageError
    from infer_ctl.profile import parse_profile_text
    from infer_ctl.router.config import RouterConfig, from_profile
    from tests.router.kvindex.test_kv_config import BASE

    assert from_profile(parse_profile_text(BASE, "p.yaml"), env={}).settings.health_holddown_max_s == 60.0
    cfg = from_profile(parse_profile_text(BASE + "router: {health_holddown_max_s: 0}\n", "p.yaml"), env={})
    assert cfg.settings.health_holddown_max_s == 0.0
    with pytest.raises(ProfileError) as info:
        parse_profile_text(BASE + "router: {health_holddown_max_s: -1}\n", "p.yaml")
    assert any(line.startswith("router.health_holddown_max_s:") for line in info.value.errors), info.value.errors
    # set in code (embedding, tests): refused at start-up the same way
    for bad in (float("nan"), float("inf"), -1.0, 86401.0, "60", None, True):  # the profile's bounds, its types
        with pytest.raises(UsageError, match=r"router\.health_holddown_max_s: .*got"):
            RouterConfig(settings=router_settings(health_holddown_max_s=bad)).validate()


def clocked_checker() -> tuple[list[float], Any, Any]:
    """One worker, the health checker's `apply` driven by hand on a clock the test moves (`now[0]`), the
    worker seen once (process start-0) and healthy."""
    from infer_ctl.router.config import RouterConfig, worker
    from infer_ctl.router.control.health import HealthChecker
    from infer_ctl.router.daemon.assembly import build_router

    now = [0.0]
    router = build_router(RouterConfig(workers=[worker("http://127.0.0.1:1", "mixed")],
                                       settings=router_settings(health_failures=1, health_holddown_max_s=60.0)), clock=lambda: now[0])
    w = router.workers.by_url["http://127.0.0.1:1"]
    hc = HealthChecker(router)
    hc.apply(w, True, "start-0", False, None)
    return now, w, hc


def test_a_restart_during_the_hold_down_starts_it_over() -> None:
    """A server crash-looping faster than the probe period fails no check while held: each probe finds a
    new process (its /server_info start time changed). That crash is a failed hold-down, not an answer."""
    now, w, hc = clocked_checker()
    w.flap.readmit(0.0)  # as though it was let back at 0: the next ejection is a flap
    for _ in range(3):  # three flaps in a row: a 4 s hold-down
        now[0] += 1.0
        hc.apply(w, False, None, False, None)
        now[0] += 1.0
        hc.apply(w, True, "start-0", False, None)
        while not w.healthy:
            now[0] += 1.0
            hc.apply(w, True, "start-0", False, None)
    now[0] += 1.0
    hc.apply(w, False, None, False, None)
    assert not w.healthy and w.flap.holddown_s == 8.0
    for i in range(1, 12):  # a new process at every probe, 11 s: never 8 s of the same one answering
        now[0] += 1.0
        hc.apply(w, True, f"crash-{i}", False, None)
        assert not w.healthy, f"let back at probe {i} though it restarted at each one"
    assert w.flap_doc(now[0])["holddown_left_s"] == 8.0
    for _ in range(8):  # the same process answering for the whole hold-down: back
        now[0] += 1.0
        hc.apply(w, True, "crash-11", False, None)
    assert w.healthy


def test_a_worker_that_restarts_between_checks_while_in_is_damped_as_a_flap() -> None:
    """A worker that crashes and is back between two checks (a process manager restarting it within
    the health interval) never fails a check: each check finds a new process while it is in. Once is an
    ejection it is back from at once; again soon after is a flap, and it serves the hold-down."""
    now, w, hc = clocked_checker()
    now[0] += 5.0
    hc.apply(w, True, "start-1", False, None)  # the first restart: in at once, as a first ejection is
    assert w.healthy and w.restarts == 1 and w.flap.ejections == 1 and w.flap.flaps == 0
    now[0] += 5.0
    hc.apply(w, True, "start-2", False, None)  # again 5 s later: a flap, held down 1 s from this answer
    assert not w.healthy and w.flap.flaps == 1 and w.flap.holddown_s == HOLDDOWN_1
    assert w.flap_doc(now[0])["holddown_left_s"] == HOLDDOWN_1
    now[0] += 0.5
    hc.apply(w, True, "start-2", False, None)
    assert not w.healthy
    now[0] += 0.5
    hc.apply(w, True, "start-2", False, None)
    assert w.healthy
    for i in range(3, 6):  # each restart in soon after the last: 2 s, 4 s, 8 s
        now[0] += 5.0
        hc.apply(w, True, f"start-{i}", False, None)
        assert not w.healthy and w.flap.holddown_s == HOLDDOWN_1 * 2 ** (i - 2)
        while not w.healthy:
            now[0] += 1.0
            hc.apply(w, True, f"start-{i}", False, None)
    now[0] += health.FLAP_STABLE_S + 1
    hc.apply(w, True, "start-5", False, None)  # stable for the period: the next restart is a first one
    now[0] += 1.0
    hc.apply(w, True, "start-6", False, None)
    assert w.healthy and w.flap.flaps == 0 and w.restarts == 6


HOLDDOWN_1 = health.HOLDDOWN_BASE_S


def test_the_passing_checks_a_worker_comes_back_on_are_one_process_s() -> None:
    """health_successes 3: three answers in a row from one server, not from three crash-looping ones."""
    from infer_ctl.router.config import RouterConfig, worker
    from infer_ctl.router.control.health import HealthChecker
    from infer_ctl.router.daemon.assembly import build_router

    router = build_router(RouterConfig(workers=[worker("http://127.0.0.1:1", "mixed")],
                                       settings=router_settings(health_failures=1, health_successes=3)), clock=lambda: 0.0)
    w = router.workers.by_url["http://127.0.0.1:1"]
    hc = HealthChecker(router)
    hc.apply(w, True, "start-0", False, None)
    hc.apply(w, False, None, False, None)  # a first ejection: no hold-down
    assert not w.healthy and w.flap.holddown_s == 0.0
    for start in ("start-1", "start-2", "start-2"):
        hc.apply(w, True, start, False, None)
    assert not w.healthy  # start-2 answered twice
    hc.apply(w, True, "start-2", False, None)
    assert w.healthy
