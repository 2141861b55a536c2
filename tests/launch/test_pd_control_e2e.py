"""`inferctl pd control` against simulated SGLang 0.5.23 role-switch servers behind a real router: a server
drained, switched and put back in the other pool; a failed rebuild reported as a finding naming the worker
and SGLang's words and not retried; nothing switched on a stale view; one controller at a time; the
router's /admin/pd view and its action counter."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.core.pd.control import Observation, Window
from infer_ctl.launch.pd_control import PdControlLoop, parse, read_history
from infer_ctl.launch.pd_switch import RoleSwitcher
from infer_ctl.profile.load import validate_profile_data
from infer_ctl.router.control.client import AdminClient
from infer_ctl.router.daemon.embed import RouterHandle, router_config, start_router_in_thread
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.waiting import wait_for

PROFILE: dict[str, Any] = {
    "name": "pdctl",
    "nodes": [{"name": "pf-01", "host": "10.0.0.11", "roles": ["prefill"]},
              {"name": "dc-01", "host": "10.0.0.21", "roles": ["decode"]}],
    "models": {"target": {"path": "/m/t", "tp": 8}},
    "router": {"listen": "127.0.0.1:1"},
    "sglang": {"pd_role_switch": True},
    "pd": {"control": "act", "sustain_s": 0, "cooldown_s": 0, "min_requests": 1, "drain_timeout_s": 10,
           "decode_cuda_graph_memory_gb": 2.0},
}


def _spec(role: str) -> WorkerSpec:
    return WorkerSpec(role, time_scale=0.02, speculative=False, enable_pd_role_switch=True,  # type: ignore[arg-type]
                      bootstrap_timeout_s=3.0, waiting_timeout_s=3.0)


@pytest.fixture
def fleet() -> Iterator[tuple[ThreadedSimCluster, RouterHandle]]:
    c = start_cluster_in_thread([_spec("prefill"), _spec("prefill"), _spec("decode"), _spec("decode")])
    cfg = router_config(prefill=[(c.urls[0], c.workers[0].bootstrap_port), (c.urls[1], c.workers[1].bootstrap_port)],
                        decode=c.urls[2:], health_interval_s=0.2)
    handle = start_router_in_thread(cfg)
    try:
        wait_for(lambda: all(w["load_age_s"] is not None for w in _pd_doc(handle)["workers"]), 10)
        yield c, handle
    finally:
        handle.stop()
        c.stop()


def _pd_doc(handle: RouterHandle) -> dict[str, Any]:
    return httpx.get(handle.url + "/admin/pd", timeout=5).json()


def _roles(handle: RouterHandle) -> dict[str, str]:
    return {w["url"]: w["role"] for w in httpx.get(handle.url + "/admin/workers", timeout=5).json()["workers"]}


def _generate(handle: RouterHandle) -> httpx.Response:
    return httpx.post(handle.url + "/generate", json={"text": "pd control " * 20, "sampling_params":
                                                      {"max_new_tokens": 8}}, timeout=30)


class _DecodeShort(PdControlLoop):
    """The real loop on the real router, its window replaced: the decode pool far over its ITL objective."""

    def observe(self) -> Observation:
        servers, _, stale = parse(self.client.call("GET", "/admin/pd"))
        return Observation(tuple(servers), Window(50, 0.1, 1.0, 100.0, 500.0), stale)


def _loop(handle: RouterHandle, tmp_path: Path, **kw: Any) -> PdControlLoop:
    prof = validate_profile_data(PROFILE)
    client = AdminClient(handle.url, timeout=30)
    switcher = RoleSwitcher(client, decode_cuda_graph_memory_gb=2.0, drain_timeout_s=10)
    return _DecodeShort(prof, router_url=handle.url, mode="act", switcher=switcher, client=client,
                        history=tmp_path / "history.jsonl", state_path=tmp_path / "state.json", **kw)


def test_a_prefill_moves_to_the_decode_pool_and_serves_there(
        fleet: tuple[ThreadedSimCluster, RouterHandle], tmp_path: Path) -> None:
    _, handle = fleet
    assert _generate(handle).status_code == 200
    loop = _loop(handle, tmp_path)
    recs = loop.tick()
    assert [r["action"] for r in recs] == ["switch"], recs
    moved = recs[0]["server"]
    assert recs[0]["result"]["ok"] and recs[0]["to_role"] == "decode"
    assert _roles(handle)[moved] == "decode"
    assert httpx.get(moved + "/model_info", timeout=5).json()["disaggregation_mode"] == "decode"
    # the fleet now runs 1P+3D: the last prefill is never taken
    assert loop.tick() == []
    wait_for(lambda: next(w for w in _pd_doc(handle)["workers"] if w["url"] == moved)["available"], 10)
    for _ in range(6):  # requests through every decode, the moved one included
        assert _generate(handle).status_code == 200
    hist = read_history(tmp_path / "history.jsonl")
    assert [h["action"] for h in hist] == ["switch"] and hist[0]["kind"] == "pd_action"
    metrics = httpx.get(handle.url + "/metrics", timeout=5).text
    assert 'inferctl_router_pd_actions_total{action="switch",to_role="decode"} 1.0' in metrics


def test_a_failed_rebuild_is_a_finding_and_never_retried(
        fleet: tuple[ThreadedSimCluster, RouterHandle], tmp_path: Path) -> None:
    c, handle = fleet
    for w in c.workers[:2]:
        w.role_switch.rebuild_fault = "KV manager init failed"
    loop = _loop(handle, tmp_path)
    recs = loop.tick()
    assert [r["action"] for r in recs] == ["failed"]
    f = recs[0]["finding"]
    bad = recs[0]["server"]
    assert f["worker"] == bad and f["restart_required"] is True
    assert f["message"] == "role switch failed; instance unhealthy, restart required: KV manager init failed"
    # left drained (SGLang: restart required), still a prefill in the router
    doc = {w["url"]: w for w in _pd_doc(handle)["workers"]}
    assert doc[bad]["draining"] and doc[bad]["role"] == "prefill"
    # later rounds never try it again, and the other prefill is now the pool's last: nothing moves
    assert all(r["action"] not in ("switch", "failed") for _ in range(3) for r in loop.tick())
    assert loop.state.fatal == [bad]
    # a restarted controller too (the state file)
    again = _loop(handle, tmp_path)
    assert all(r["action"] not in ("switch", "failed") for r in again.tick())


def test_a_refusal_at_the_preflight_never_drains(fleet: tuple[ThreadedSimCluster, RouterHandle], tmp_path: Path) -> None:
    c, handle = fleet
    for w in c.workers[:2]:
        w.role_switch.in_progress = True  # SGLang: "another role switch is already in progress" (not safe)
    recs = _loop(handle, tmp_path).tick()
    assert recs[0]["action"] == "failed"
    assert recs[0]["finding"]["message"] == "another role switch is already in progress"
    assert not any(w["draining"] for w in _pd_doc(handle)["workers"])  # refused at preflight: never drained


def test_nothing_is_switched_on_a_stale_view(fleet: tuple[ThreadedSimCluster, RouterHandle], tmp_path: Path) -> None:
    _, handle = fleet

    class _Stale(_DecodeShort):
        def observe(self) -> Observation:
            obs = super().observe()
            return Observation(obs.servers, obs.window, 60.0)

    prof = validate_profile_data(PROFILE)
    client = AdminClient(handle.url, timeout=30)
    loop = _Stale(prof, router_url=handle.url, mode="act", switcher=RoleSwitcher(client), client=client,
                  state_path=tmp_path / "s.json")
    recs = loop.tick() + loop.tick()
    assert [r["action"] for r in recs] == ["stale"]  # recorded once, not every round
    assert sorted(_roles(handle).values()) == ["decode", "decode", "prefill", "prefill"]


def test_one_controller_at_a_time(fleet: tuple[ThreadedSimCluster, RouterHandle], tmp_path: Path) -> None:
    _, handle = fleet
    a, b = _loop(handle, tmp_path), _loop(handle, tmp_path)
    with a._exclusive() as mine:
        assert mine
        assert b.tick() == []  # skipped while the other holds the lock
        assert b.rounds_skipped == 1 and b.rounds_run == 0 and b.last_skip is not None
        assert b.last_skip["holder"]["pid"] == os.getpid()
    assert sorted(_roles(handle).values()) == ["decode", "decode", "prefill", "prefill"]


def test_admin_pd_view(fleet: tuple[ThreadedSimCluster, RouterHandle]) -> None:
    _, handle = fleet
    with httpx.stream("POST", handle.url + "/generate", json={"text": "stream " * 30, "stream": True,
                                                               "sampling_params": {"max_new_tokens": 6}}, timeout=30) as r:
        assert r.status_code == 200
        for _ in r.iter_bytes():
            pass
    doc = _pd_doc(handle)
    assert {w["role"] for w in doc["workers"]} == {"prefill", "decode"}
    assert doc["counters"]["ttft_count"] >= 1 and doc["counters"]["itl_count"] >= 1
    r = httpx.post(handle.url + "/admin/pd/actions", json={"action": "bogus"}, timeout=5)
    assert r.status_code == 400


class _Calm(PdControlLoop):
    """The real loop, its window one where both pools meet their objectives: only capacity back acts."""

    def observe(self) -> Observation:
        servers, _, stale = parse(self.client.call("GET", "/admin/pd"))
        return Observation(tuple(servers), Window(50, 0.1, 0.01, 100.0, 50.0), stale)


def test_capacity_back_a_dead_decode_is_covered_by_a_prefill_and_given_back(
        fleet: tuple[ThreadedSimCluster, RouterHandle], tmp_path: Path) -> None:
    c, handle = fleet
    prof = validate_profile_data(PROFILE)
    client = AdminClient(handle.url, timeout=30)
    loop = _Calm(prof, router_url=handle.url, mode="act", client=client, state_path=tmp_path / "s.json",
                 switcher=RoleSwitcher(client, decode_cuda_graph_memory_gb=2.0, drain_timeout_s=10))
    assert loop.tick() == []
    dead = c.urls[3]
    c.stop_worker(3)  # kill -9 of one of two decodes, as the router sees it: it stops answering
    wait_for(lambda: not next(w for w in _pd_doc(handle)["workers"] if w["url"] == dead)["healthy"], 10)
    recs = loop.tick()
    assert [r["action"] for r in recs] == ["cover"] and recs[0]["covers"] == dead, recs
    cover = recs[0]["server"]
    assert _roles(handle)[cover] == "decode" and recs[0]["result"]["seconds"] < 10
    assert _generate(handle).status_code == 200
    assert loop.tick() == []  # covered once
    c.start_worker(3)  # the relaunch
    wait_for(lambda: next(w for w in _pd_doc(handle)["workers"] if w["url"] == dead)["available"], 15)
    recs = loop.tick()
    assert [(r["action"], r["server"], r["to_role"]) for r in recs] == [("restore", cover, "prefill")]
    assert sorted(_roles(handle).values()) == ["decode", "decode", "prefill", "prefill"]
    assert loop.state.covers == {}


def test_the_state_file_keeps_the_fatal_servers_seen_down(tmp_path: Path) -> None:
    # a restart seen by one controller process is not forgotten by the next (cron: one process a round)
    prof = validate_profile_data(PROFILE)
    a = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=tmp_path / "s.json")
    a.state.fatal, a.state.fatal_down = ["http://p0", "http://p1"], ["http://p1"]
    a._save_state()
    b = PdControlLoop(prof, router_url="http://127.0.0.1:1", mode="advise", state_path=tmp_path / "s.json")
    b._load_state()
    assert (b.state.fatal, b.state.fatal_down) == (["http://p0", "http://p1"], ["http://p1"])
