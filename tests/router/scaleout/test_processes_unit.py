"""The parts of `router serve --processes N` that need no running router: the shared load block, the
process plan (why one process), the leader's snapshot applied by a follower, the metrics merge."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from infer_ctl.core.routing.prefixes import Placement
from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig, router_settings, worker
from infer_ctl.router.control.admin import Admin
from infer_ctl.router.daemon.assembly import Seat, build_router
from infer_ctl.router.daemon.procs import fetch_server_info, plan, reserve_port
from infer_ctl.router.fleet.shared_load import SharedLoad, row_cells
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout import follow
from infer_ctl.router.scaleout.follow import Publisher, apply_snapshot, read_snapshot, snapshot_doc
from infer_ctl.router.scaleout.metrics_merge import merge
from tests.router.conftest import new_kv_routing


def pd_cfg(**kw: Any) -> RouterConfig:
    return RouterConfig(workers=[worker("http://127.0.0.1:1", "prefill", 9), worker("http://127.0.0.1:2", "prefill", 9),
                                 worker("http://127.0.0.1:3", "decode")], settings=router_settings(**kw))


@pytest.fixture
def block() -> Any:
    b = SharedLoad.create(2, 5)
    yield b
    b.close()


def test_each_process_writes_its_row_and_the_load_is_the_column_sum(block: SharedLoad) -> None:
    other = SharedLoad.attach(block.name, 2, 5)
    try:
        mine = build_router(pd_cfg(), seat=Seat(block, 0, 2, flights=False))
        theirs = build_router(pd_cfg(), seat=Seat(other, 1, 2, flights=False))
        a, b = mine.workers.by_url["http://127.0.0.1:2"], theirs.workers.by_url["http://127.0.0.1:2"]
        assert (a.slot, b.slot) == (1, 1) and a.cell != b.cell
        a.inflight += 1
        b.inflight += 1
        b.inflight += 1
        assert (a.inflight, b.inflight) == (1, 2)  # each process's own count
        assert a.load_inflight == b.load_inflight == 3  # what the policy sees, in both
        assert a.view(0.0).inflight == 3
        assert block.row(0) == [0, 1, 0, 0, 0] and block.row(1) == [0, 2, 0, 0, 0]
        block.zero_row(1)  # the supervisor, for a dead process
        assert a.load_inflight == 1
    finally:
        other.close()
    assert row_cells(5) == 8 and row_cells(9) == 16  # rows are whole cache lines


def test_a_runtime_worker_takes_the_next_slot_until_none_is_left() -> None:
    block = SharedLoad.create(1, 4)
    try:
        r = build_router(pd_cfg(), seat=Seat(block, 0, 1, flights=False))
        assert r.workers.add(worker("http://127.0.0.1:4", "decode")).slot == 3
        with pytest.raises(UsageError, match="no free worker slot"):
            r.workers.add(worker("http://127.0.0.1:5", "decode"))
    finally:
        block.close()


def test_adding_a_worker_when_no_slot_is_left_answers_400_not_500() -> None:
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from infer_ctl.router.daemon.assembly import build

    async def go(admin: Admin) -> tuple[int, str]:
        app = web.Application()
        admin.routes(app)
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/admin/workers", json={"url": "http://127.0.0.1:9", "role": "decode"})
            return resp.status, await resp.text()

    block = SharedLoad.create(1, 3)
    server = build(pd_cfg(), seat=Seat(block, 0, 1, flights=False))  # the three configured workers took every slot
    r = server.router
    try:
        status, body = asyncio.run(go(server.admin))
        assert status == 400 and "no free worker slot" in body and "restart the router" in body
        assert "http://127.0.0.1:9" not in r.workers.by_url
    finally:
        for w in r.workers.all():
            w.shared = None
        block.close()


def info_with_events(url: str) -> dict[str, Any]:
    return {"kv_events": {"endpoint_port_base": 5557}}


def test_plan_runs_one_process_without_kv_events() -> None:
    assert plan(pd_cfg(), 2, info_with_events)[0] == 2
    n, why = plan(pd_cfg(), 2, lambda url: {} if url.endswith(":2") else info_with_events(url))
    assert n == 1 and "http://127.0.0.1:2 publishes no KV events" in why
    n, why = plan(pd_cfg(), 2, lambda url: None)
    assert n == 1 and "did not answer" in why
    assert plan(pd_cfg(kv_events={"enabled": False}), 4, info_with_events)[0] == 1
    # no cache index to disagree on: the processes share all they use
    assert plan(pd_cfg(policy="round_robin"), 3, lambda url: None)[0] == 3
    assert plan(pd_cfg(), 1, info_with_events) == (1, "one process requested")
    n, why = plan(pd_cfg(state_store="redis://127.0.0.1:6379/0"), 2, info_with_events)
    assert n == 1 and "replicas" in why


def test_a_follower_takes_the_leaders_workers_drains_and_prefixes() -> None:
    leader, follower, blocks = _shared_pair()
    try:
        leader.workers.add(worker("http://127.0.0.1:7", "decode"))
        leader.workers.remove("http://127.0.0.1:2")
        leader.workers.by_url["http://127.0.0.1:1"].draining = True
        rec = leader.prefixes.register("sys", "You are terse.", now=1.0, ttl_s=60, replicas=2, pin=True)
        rec.placements["http://127.0.0.1:1"] = Placement("http://127.0.0.1:1", warmed_at=2.0, needs_rewarm=False)
        added: list[str] = []
        apply_snapshot(follower, snapshot_doc(leader), lambda w: added.append(w.url))
        fw = follower.workers.by_url
        assert set(fw) == {"http://127.0.0.1:1", "http://127.0.0.1:3", "http://127.0.0.1:7"}
        assert added == ["http://127.0.0.1:7"] and fw["http://127.0.0.1:7"].slot == 3  # the leader's slot
        assert fw["http://127.0.0.1:1"].draining and not fw["http://127.0.0.1:3"].draining
        got = follower.prefixes.match("You are terse. Q?")
        assert got is not None and (got.version, got.ttl_s, got.replicas, got.pin) == (1, 60, 2, True)
        assert got.warm_replicas() == ["http://127.0.0.1:1"]
        assert snapshot_doc(follower) == snapshot_doc(leader)
        # the leader expires it: gone from the follower's routing at the next snapshot
        leader.prefixes.expire("sys", 3.0)
        apply_snapshot(follower, snapshot_doc(leader))
        assert follower.prefixes.match("You are terse. Q?") is None
    finally:
        _close([leader, follower], blocks)


def _shared_pair(slots: int = 8) -> tuple[Router, Router, list[SharedLoad]]:
    blocks = [SharedLoad.create(1, slots), SharedLoad.create(1, slots)]
    leader = build_router(pd_cfg(), seat=Seat(blocks[0], 0, 1, flights=False))
    follower = build_router(pd_cfg(), seat=Seat(blocks[1], 0, 1, flights=False))
    return leader, follower, blocks


def _close(routers: list[Router], blocks: list[SharedLoad]) -> None:
    for r in routers:
        for w in r.workers.all():
            w.shared = None
    for b in blocks:
        b.close()


def test_a_worker_removed_and_added_again_between_two_polls_moves_to_its_new_slot() -> None:
    """The follower kept the old slot: its in-flight count there was summed by nobody (the leader reads
    the new slot), so the leader routed to the worker as if the follower sent it nothing."""
    leader, follower, blocks = _shared_pair()
    try:
        url = "http://127.0.0.1:7"
        leader.workers.add(worker(url, "decode"))
        apply_snapshot(follower, snapshot_doc(leader))
        assert follower.workers.by_url[url].slot == 3
        leader.workers.remove(url)
        assert leader.workers.add(worker(url, "decode")).slot == 4  # slots are not reused
        apply_snapshot(follower, snapshot_doc(leader))  # the follower never saw the removal
        assert follower.workers.by_url[url].slot == 4
        assert snapshot_doc(follower) == snapshot_doc(leader)
    finally:
        _close([leader, follower], blocks)


def test_a_corrupt_snapshot_changes_nothing_and_a_leader_starts_without_it(tmp_path: Any) -> None:
    leader, follower, blocks = _shared_pair()
    try:
        apply_snapshot(follower, snapshot_doc(leader))
        before = snapshot_doc(follower)
        doc = snapshot_doc(leader)
        doc["workers"] = doc["workers"][:1]  # would remove two workers...
        doc["prefixes"] = [{"name": "x"}]  # ...but the prefix table is broken: the whole file is refused
        with pytest.raises(ValueError, match="not a router state snapshot"):
            apply_snapshot(follower, doc)
        assert snapshot_doc(follower) == before
        for bad in ({"workers": [{"url": "http://127.0.0.1:9", "role": "decode", "bootstrap_port": None,
                                  "slot": 99, "draining": False}], "prefixes": []},
                    {"workers": "no", "prefixes": []}, {"workers": [], "prefixes": [{"name": 1, "text": 2}]}):
            with pytest.raises(ValueError):
                apply_snapshot(follower, bad)
            assert snapshot_doc(follower) == before
        # a restarted leader with a corrupt state.json starts from the profile instead of crash-looping
        path = tmp_path / "state.json"
        for data in (b"{not json", b'{"version": 3, "workers": 5}'):
            path.write_bytes(data)
            pub = Publisher(leader, path)
            assert pub.adopt() is False
            assert pub.publish() and read_snapshot(path)["version"] == 1
    finally:
        _close([leader, follower], blocks)


def test_a_restarted_leader_warms_again_what_the_dead_one_was_warming(tmp_path: Any) -> None:
    """The snapshot said `warming` for a warm-up in flight when the leader died: adopted as is, that
    replica was skipped by every later plan (no warm_done would ever come) and never warmed."""
    from infer_ctl.core.routing.policy import WorkerView

    dead = build_router(pd_cfg())
    rec = dead.prefixes.register("sys", "You are terse.", now=1.0, ttl_s=None, replicas=1, pin=False)
    rec.placements["http://127.0.0.1:1"] = Placement("http://127.0.0.1:1", warming=True)
    path = tmp_path / "state.json"
    Publisher(dead, path).publish()
    new = build_router(pd_cfg())
    assert Publisher(new, path).adopt()
    views = [WorkerView("http://127.0.0.1:1", 0, 0, True)]
    assert [(a.name, a.worker) for a in new.prefixes.plan_warmups(views, 2.0)] == [("sys", "http://127.0.0.1:1")]


def test_the_leaders_loop_serializes_only_after_a_counted_change_and_still_publishes_every_change(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 100 ms loop (`publish(force=False)`) serializes when the prefixes' change counter or a worker's
    snapshot fields moved, not on every check; every change still reaches the file: each counted one at
    the next check, one made past the counters (a field set directly) within `_FULL_EVERY` checks."""
    from infer_ctl.core.routing.policy import WorkerView

    leader = build_router(pd_cfg())
    path = tmp_path / "state.json"
    pub = Publisher(leader, path)
    built = []
    real = follow.snapshot_doc
    monkeypatch.setattr(follow, "snapshot_doc", lambda r: built.append(1) or real(r))

    def version() -> int:
        return int(read_snapshot(path)["version"])  # type: ignore[index]

    assert pub.publish(force=False) and version() == 1 and len(built) == 1  # the first check always does
    for _ in range(follow._FULL_EVERY - 1):
        assert not pub.publish(force=False)
    assert len(built) == 1  # idle: nothing serialized for 9 checks ...
    assert not pub.publish(force=False) and len(built) == 2  # ... then once, finding nothing new
    views = [WorkerView("http://127.0.0.1:1", 0, 0, True), WorkerView("http://127.0.0.1:2", 0, 0, True)]
    actions: list[Any] = []
    changes = [
        lambda: leader.prefixes.register("sys", "You are terse.", now=1.0),
        lambda: actions.extend(leader.prefixes.plan_warmups(views, 2.0)),  # a placement, warming
        lambda: [leader.prefixes.warm_done(a, True, 3.0) for a in actions],
        lambda: setattr(leader.workers.by_url["http://127.0.0.1:2"], "draining", True),
        lambda: leader.prefixes.drop_worker("http://127.0.0.1:1"),
        lambda: leader.prefixes.expire("sys", 4.0),
    ]
    for i, change in enumerate(changes):
        before = snapshot_doc(leader)
        change()
        assert snapshot_doc(leader) != before, i
        assert pub.publish(force=False), i  # published at the next check
        assert read_snapshot(path)["prefixes"] == snapshot_doc(leader)["prefixes"]  # type: ignore[index]
    v = version()
    leader.prefixes.records()[0].ttl_s = 5.0  # past the counters
    published = [pub.publish(force=False) for _ in range(follow._FULL_EVERY)]
    assert published.count(True) == 1 and version() == v + 1
    assert read_snapshot(path)["prefixes"][0]["ttl_s"] == 5.0  # type: ignore[index]
    # the admin API's publish_now always compares the whole state
    leader.prefixes.records()[0].replicas = 2
    pub.publish_now()
    assert version() == v + 2


def test_metrics_merge_keeps_one_family_and_labels_each_process() -> None:
    a = ('# HELP inferctl_router_requests_total r\n# TYPE inferctl_router_requests_total counter\n'
         'inferctl_router_requests_total{status="200"} 3.0\n'
         '# HELP inferctl_router_worker_inflight w\n# TYPE inferctl_router_worker_inflight gauge\n'
         'inferctl_router_worker_inflight{worker="u"} 4.0\n')
    b = a.replace(" 3.0", " 5.0")
    text = merge([(0, a), (1, b)], own=1).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    reqs = {s.labels["router_process"]: s.value for s in fams["inferctl_router_requests"].samples}
    assert reqs == {"0": 3.0, "1": 5.0}
    # read from the shared block in every process: once, unlabelled, not N times
    assert [(s.labels, s.value) for s in fams["inferctl_router_worker_inflight"].samples] == [({"worker": "u"}, 4.0)]
    assert text.count("# TYPE inferctl_router_requests_total counter") == 1
    # another process's file that does not parse is left out, not a failed scrape
    text = merge([(0, a), (1, "inferctl_router_requests_total{status=\"200\" 3.0\n")], own=0).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert {s.labels["router_process"] for s in fams["inferctl_router_requests"].samples} == {"0"}


def test_a_port_held_by_another_reuseport_listener_is_refused() -> None:
    """SO_REUSEPORT would let a second router join the first one's group and take half its connections."""
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    other.bind(("127.0.0.1", 0))
    other.listen()
    try:
        with pytest.raises(UsageError, match=r"cannot listen on 127\.0\.0\.1"):
            reserve_port("127.0.0.1", other.getsockname()[1])
    finally:
        other.close()
    port, holder, lock = reserve_port("127.0.0.1", 0)
    assert holder is not None and port > 0
    holder.close()
    os.close(lock)


def test_two_routers_reserving_one_port_at_once_cannot_both_get_it() -> None:
    """The bind check closes its socket before the router processes bind (their start-up, a second or
    more): a second router's check in that window passed too, and both joined one SO_REUSEPORT group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got, holder, lock = reserve_port("127.0.0.1", port)
    assert (got, holder) == (port, None)
    try:
        with pytest.raises(UsageError, match="another inferctl router"):
            reserve_port("127.0.0.1", port)
        with pytest.raises(UsageError, match="another inferctl router"):  # another address, the same port
            reserve_port("0.0.0.0", port)
    finally:
        os.close(lock)  # the router stopped (its processes too): the port is free again
    os.close(reserve_port("127.0.0.1", port)[2])


def test_server_info_is_read_from_the_worker_itself_not_through_a_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Info(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"kv_events": {"endpoint_port_base": 5557}}).encode()
            self.send_response(200 if self.path == "/server_info" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Info)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert fetch_server_info(url) == {"kv_events": {"endpoint_port_base": 5557}}
        assert fetch_server_info("http://127.0.0.1:9") is None
    finally:
        server.shutdown()


class _Exited:
    pid, returncode = 4242, 1

    def poll(self) -> int:
        return 1


def _supervisor(tmp_path: Any, lived_s: float, ready: bool) -> tuple[Any, Any, list[float]]:
    from infer_ctl.router.daemon.procs import Supervisor
    from infer_ctl.router.scaleout.follow import ProcessRole

    sup = Supervisor(pd_cfg(), 2)
    role = ProcessRole(1, 2, str(tmp_path), "unused", 8)
    spawned: list[float] = []

    def spawn(r: Any) -> None:  # a process that exits at once, having run `lived_s` (and got ready, or not)
        import time

        spawned.append(time.monotonic())
        sup.procs[r.index], sup.started[r.index] = _Exited(), time.monotonic() - lived_s
        if ready:
            r.ready_file(r.index).touch()

    sup._spawn = spawn  # type: ignore[method-assign]
    spawn(role)
    return sup, role, spawned


def test_a_process_crashing_again_and_again_is_restarted_after_a_growing_delay(tmp_path: Any) -> None:
    """It was started again at once every time: a process dying 3 s after each start (past the 2 s of a
    start-up failure) made the supervisor spin a Python start-up per crash forever, a core's worth."""
    import time

    sup, role, spawned = _supervisor(tmp_path, 3.0, ready=True)
    block = SharedLoad.create(2, 8)
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            assert sup._check(role, block) == 0  # not a start-up failure: it keeps serving
            time.sleep(0.01)
    finally:
        block.close()
    # the first restart is immediate, then 0.5 s, then 1 s: four starts in 1.5 s, not ~150
    assert 3 <= len(spawned) <= 4, len(spawned)


def test_a_process_that_never_got_ready_is_a_start_up_failure_however_slow(tmp_path: Any) -> None:
    import time

    sup, role, spawned = _supervisor(tmp_path, 5.0, ready=False)  # a slow start-up (a loaded box), then exit
    block = SharedLoad.create(2, 8)
    try:
        end, rc = time.monotonic() + 3.0, 0
        while not rc and time.monotonic() < end:
            rc = sup._check(role, block)
            time.sleep(0.01)
    finally:
        block.close()
    assert (rc, len(spawned)) == (1, 3)  # the third failed start stops the router, with the process's status


def test_a_prefill_that_stops_publishing_kv_events_is_logged_with_several_processes(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio


    async def go() -> None:
        kv = new_kv_routing(processes=2)
        url = "http://127.0.0.1:1"
        kv.configure(url, {"kv_events": {"endpoint_host": "127.0.0.1", "endpoint_port_base": 9}})
        assert url in kv.workers
        kv.configure(url, {})  # restarted without --kv-events-config
        assert url not in kv.workers
        await kv.stop()

    with caplog.at_level("WARNING", logger="infer_ctl.router.kv"):
        asyncio.run(go())
    assert any("publishes no more KV events" in r.getMessage() for r in caplog.records)


def test_the_state_of_routers_killed_all_at_once_is_swept_at_the_next_start() -> None:
    """systemd's SIGKILL of the whole group kills the supervisor, its processes and the resource tracker:
    nobody was left to remove the state directory or unlink the shared block."""
    import tempfile
    from multiprocessing import resource_tracker, shared_memory
    from pathlib import Path

    from infer_ctl.router.daemon.procs import _join, sweep_stale

    dead, live, other = (tempfile.mkdtemp(prefix="inferctl-router-") for _ in range(3))
    shm = shared_memory.SharedMemory(create=True, size=64)
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]  # as if it died
    Path(dead, "shm").write_text(shm.name)
    os.close(_join(dead))  # its members are gone: nobody holds the lock
    held = _join(live)  # a live router's
    try:
        removed = sweep_stale()
        assert dead in removed and not os.path.exists(dead) and not os.path.exists(f"/dev/shm/{shm.name}")
        assert os.path.isdir(live) and os.path.isdir(other)  # live; not a state directory of processes
    finally:
        os.close(held)
        shm.close()
        import shutil

        for d in (dead, live, other):
            shutil.rmtree(d, ignore_errors=True)


def test_a_scrape_leaves_out_a_dead_processs_stale_file(tmp_path: Any) -> None:
    import time

    from infer_ctl.router.scaleout.metrics_merge import STALE_S, ProcessMetrics

    fam = ('# HELP inferctl_router_requests_total r\n# TYPE inferctl_router_requests_total counter\n'
           'inferctl_router_requests_total{status="200"} %d.0\n')
    files = {i: tmp_path / f"metrics-{i}.prom" for i in range(3)}
    files[1].write_text(fam % 5)
    files[2].write_text(fam % 7)
    old = time.time() - STALE_S - 1
    os.utime(files[2], (old, old))  # process 2 died a while ago
    pm = ProcessMetrics(lambda: (fam % 3).encode(), 0, 3, files.__getitem__)
    fams = {f.name: f for f in text_string_to_metric_families(pm.scrape().decode())}
    got = {s.labels["router_process"]: s.value for s in fams["inferctl_router_requests"].samples}
    assert got == {"0": 3.0, "1": 5.0}


def test_an_idle_process_touches_its_metrics_file_instead_of_rendering(tmp_path: Any, monkeypatch: Any) -> None:
    """Rendering every second was most of an idle 2-process router's CPU (docs/benchmarks.md, "Where the
    inferctl router's CPU goes"): without an answered request only the file's time moves, until REFRESH_S."""
    import asyncio
    import time

    from infer_ctl.router.scaleout import metrics_merge

    monkeypatch.setattr(metrics_merge, "WRITE_S", 0.01)
    renders, answered = [], [0]
    path = tmp_path / "metrics-0.prom"

    def render() -> bytes:
        renders.append(1)
        return b"# rendered\n"

    pm = metrics_merge.ProcessMetrics(render, 0, 2, lambda i: path, lambda: answered[0])

    async def until(cond: Any, timeout: float = 10.0) -> bool:
        # what the writer does within some ticks, polled: on a loaded machine a 0.1 s window may hold
        # no tick of the writer at all (the lag probe of kvindex/test_stream.py saw 0.5 s in a full-suite run)
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return bool(cond())

    async def main() -> None:
        pm.start()
        assert await until(path.exists)
        await asyncio.sleep(0.2)  # ~20 writer ticks
        idle = len(renders)
        os.utime(path, (1.0, 1.0))
        assert await until(lambda: path.stat().st_mtime > 1.0)  # kept fresh for the other processes' scrapes
        assert len(renders) == idle == 1  # ticks, one render
        answered[0] += 1
        assert await until(lambda: len(renders) >= 2)
        assert len(renders) == 2  # a request answered: rendered again (once)
        monkeypatch.setattr(metrics_merge, "REFRESH_S", 0.0)
        assert await until(lambda: len(renders) > 3)  # gauges move without requests: rendered every REFRESH_S
        await pm.stop()

    asyncio.run(main())


def test_each_process_keeps_its_admin_counters_and_the_leader_adds_them_up(tmp_path: Any, monkeypatch: Any) -> None:
    """/admin/status is the leader's (every process relays /admin/ to it): the followers' request-path
    anchoring and coalescing counters were not in it. A counters file beside each metrics file, written
    when they change; the leader sums the live ones (a dead process's stale file is left out)."""
    import asyncio
    import json
    import time

    from infer_ctl.router.scaleout import metrics_merge
    from infer_ctl.router.scaleout.metrics_merge import STALE_S, ProcessMetrics, add_counters, counters_file

    monkeypatch.setattr(metrics_merge, "WRITE_S", 0.01)
    files = {i: tmp_path / f"metrics-{i}.prom" for i in range(3)}
    mine = {"first_sight": {"anchored": 2, "over_budget": 0, "seconds": 0.25}, "coalesce": {"promoted": 1}}
    follower = ProcessMetrics(lambda: b"", 1, 3, files.__getitem__, counters=lambda: json.loads(json.dumps(mine)))

    async def main() -> None:
        follower.start()
        deadline = time.monotonic() + 10
        while not counters_file(files[1]).exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        mine["first_sight"]["anchored"] = 5  # changed: written again
        while json.loads(counters_file(files[1]).read_text())["first_sight"]["anchored"] != 5 \
                and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await follower.stop()

    asyncio.run(main())
    counters_file(files[2]).write_text(json.dumps({"first_sight": {"anchored": 100}}))
    old = time.time() - STALE_S - 1
    os.utime(counters_file(files[2]), (old, old))  # process 2 died a while ago
    leader = ProcessMetrics(lambda: b"", 0, 3, files.__getitem__)
    peers = leader.peer_counters()
    assert peers == [mine]
    own = {"first_sight": {"anchored": 1, "over_budget": 3, "seconds": 0.5}, "coalesce": {"promoted": 0}, "x": "a"}
    assert add_counters([own, *peers]) == {"first_sight": {"anchored": 6, "over_budget": 3, "seconds": 0.75},
                                           "coalesce": {"promoted": 1}, "x": "a"}


def test_a_peer_counters_file_from_the_future_or_hostile_is_left_out(tmp_path: Any) -> None:
    """The leader reads the other processes' counters files (20388b0): after the wall clock steps back,
    a dead process's file (its mtime now ahead of the clock) read as fresh until the clock caught up;
    a file nested past the JSON parser's depth raised RecursionError out of /admin/status; a file could
    add keys to the status, or NaN / 1e400 / 10**400 (OverflowError against a float) to its counts."""
    import json
    import time

    from infer_ctl.router.scaleout import metrics_merge as mm

    files = {i: tmp_path / f"metrics-{i}.prom" for i in range(6)}
    ok = {"first_sight": {"anchored": 1, "over_budget": 0, "seconds": 0.5}, "coalesce": {"promoted": 2}}
    mm.counters_file(files[1]).write_text(json.dumps(ok))
    mm.counters_file(files[2]).write_text(json.dumps({"first_sight": {"anchored": 100}}))
    ahead = time.time() + mm.STALE_S + 60  # written before the clock stepped back a minute, process gone
    os.utime(mm.counters_file(files[2]), (ahead, ahead))
    mm.counters_file(files[3]).write_text("[" * 200_000)
    mm.counters_file(files[4]).write_text(json.dumps({"pad": "x" * mm.MAX_COUNTERS_BYTES}))
    hostile = ('{"first_sight": {"anchored": NaN, "over_budget": 1e400, "seconds": ' + str(10**400)
               + ', "extra": 7}, "coalesce": {"promoted": "9"}, "injected": {"a": 1}}')
    mm.counters_file(files[5]).write_text(hostile)
    leader = mm.ProcessMetrics(lambda: b"", 0, 6, files.__getitem__)
    peers = leader.peer_counters()
    assert peers[0] == ok and len(peers) == 2  # 1 and 5: the future, deep and big files left out
    own = {"first_sight": {"anchored": 3, "over_budget": 1, "seconds": 0.25}, "coalesce": {"promoted": 0}}
    total = mm.add_counters([own, *peers])
    assert total == {"first_sight": {"anchored": 4, "over_budget": 1, "seconds": 0.75}, "coalesce": {"promoted": 2}}
