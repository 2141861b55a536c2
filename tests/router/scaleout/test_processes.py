"""`router serve --processes 2` end to end: real router processes (the CLI's supervisor) on one loopback
port with SO_REUSEPORT, in front of simulated PD workers that publish SGLang KV events. Connections spread
over both processes; a request in flight in one process is seen by the other (the shared load block);
an admin change made through any process is in force in both within 1 s; a follower killed with -9 is
started again while the leader's streams finish; without KV events the router runs one process and its
start-up log says why."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.ports import free_port
from tests.router.conftest import TIME_SCALE
from tests.sim.kv_client import kv_config
from tests.waiting import wait_for


class Router:
    """`inferctl router serve --processes N` as a subprocess, its JSON log lines in a file."""

    def __init__(self, cluster: ThreadedSimCluster, processes: int = 2, *extra: str, port: int = 0) -> None:
        self.port = port or free_port()
        self.processes = processes
        self.log = Path(tempfile.mkstemp(prefix="router-procs-", suffix=".log")[1])
        args = [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{self.port}",
                "--processes", str(processes), "--log-requests", *extra]
        for w in cluster.workers:
            args += (["--prefill", f"{w.url}@{w.bootstrap_port}"] if w.spec.role == "prefill"
                     else ["--decode", w.url])
        env = {k: v for k, v in os.environ.items() if k != "INFERCTL_ROUTER_TOKEN"}
        env["PYTHONPATH"] = os.getcwd()
        self.fh = self.log.open("wb")
        self.proc = subprocess.Popen(args, stderr=self.fh, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        assert wait_for(self._up, 60), self.logs()[-20:]

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the router exited: {self.logs()[-5:]}")
        msgs = [str(d.get("msg", "")) for d in self.logs()]
        single = any(m.startswith("router runs one process") for m in msgs) or self.processes == 1
        return "router processes ready" in msgs or (single and "router listening" in msgs)

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.fh.close()
        return self.proc.returncode


def health(conn: http.client.HTTPConnection) -> dict[str, Any]:
    conn.request("GET", "/health")
    doc: dict[str, Any] = json.loads(conn.getresponse().read())
    return doc


def conn_to(port: int, index: int, tries: int = 400) -> http.client.HTTPConnection:
    """A keep-alive connection that the kernel gave to router process `index`. A connection reset is
    tried again: one still queued on a process that was just killed is reset by the kernel."""
    for _ in range(tries):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            if health(conn)["process"]["index"] == index:
                return conn
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)
        conn.close()
    raise AssertionError(f"no connection reached process {index} in {tries} tries")


def generate(conn: http.client.HTTPConnection, text: str, tokens: int = 2, stream: bool = False) -> tuple[int, bytes]:
    body = json.dumps({"text": text, "stream": stream, "sampling_params": {"max_new_tokens": tokens}})
    conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


@pytest.fixture(scope="module")
def kv_cluster() -> Iterator[ThreadedSimCluster]:
    kw: dict[str, Any] = {"time_scale": TIME_SCALE, "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    cluster = start_cluster_in_thread([WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
                                       WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
                                       WorkerSpec("decode", **kw)])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def router(kv_cluster: ThreadedSimCluster) -> Iterator[Router]:
    r = Router(kv_cluster, 2)
    yield r
    assert r.stop() == 0


def test_connections_spread_over_both_processes(router: Router) -> None:
    seen: dict[int, int] = {}
    for _ in range(60):
        conn = http.client.HTTPConnection("127.0.0.1", router.port, timeout=10)
        doc = health(conn)
        seen[doc["process"]["index"]] = doc["process"]["pid"]
        assert generate(conn, "hello there")[0] == 200
        conn.close()
    assert set(seen) == {0, 1} and seen[0] != seen[1]

    # /metrics from whichever process answers: both processes' counters, one family each
    def both_counted() -> bool:
        text = httpx.get(router.url + "/metrics", headers={"Connection": "close"}, timeout=5).text
        lines = [ln for ln in text.splitlines() if ln.startswith("inferctl_router_requests_total{")]
        assert text.count("# TYPE inferctl_router_requests_total counter") == 1
        return {'router_process="0"' in ln for ln in lines} == {True, False} and all(
            'router_process="' in ln for ln in lines)

    time.sleep(1.2)
    assert all(wait_for(both_counted, 3) for _ in range(8))
    start = next(d for d in router.logs() if d.get("msg", "").startswith("router runs several processes"))
    assert "KV events" in start["msg"]


def test_in_flight_on_the_follower_is_seen_by_the_leader(router: Router, kv_cluster: ThreadedSimCluster) -> None:
    conn = conn_to(router.port, 1)
    result: list[object] = []

    def long_stream() -> None:
        try:
            result.append(generate(conn, "a long answer please", 60000, stream=True)[0])
        except (OSError, http.client.HTTPException) as exc:  # the test hangs up below
            result.append(exc)

    t = threading.Thread(target=long_stream)
    t.start()
    try:
        # /admin is answered by the leader (process 0): the follower's request shows there
        def busy() -> dict[str, int]:
            doc = httpx.get(router.url + "/admin/workers", timeout=5).json()
            return {w["role"]: w["inflight"] for w in doc["workers"] if w["inflight"] > 0}

        got = wait_for(busy, 10, 0.02)
        assert got.get("decode") == 1, got
        status = httpx.get(router.url + "/admin/status", timeout=5).json()
        assert [p["index"] for p in status["processes"]] == [0, 1]
        assert status["processes"][1]["upstream_inflight"] >= 1  # the follower's row, read by the leader

        def scraped() -> bool:  # whichever process answers /metrics: the same shared count
            metrics = httpx.get(router.url + "/metrics", headers={"Connection": "close"}, timeout=5).text
            return any(line.startswith("inferctl_router_worker_inflight{") and 'role="decode"' in line
                       and line.endswith(" 1.0") for line in metrics.splitlines())

        assert all(scraped() for _ in range(6))
        assert t.is_alive()  # still streaming: every scrape saw it in flight
    finally:
        assert conn.sock is not None
        conn.sock.shutdown(socket.SHUT_RDWR)  # the client goes away: the follower cancels the request
        t.join(60)
    assert len(result) == 1
    # the follower's count went back to 0 when it cancelled, and the leader sees that too
    assert wait_for(lambda: not any(w["inflight"] for w in httpx.get(router.url + "/admin/workers").json()["workers"]))


def test_admin_status_counts_the_followers_requests_too(router: Router) -> None:
    """/admin/ is answered by the leader; its kv_events.first_sight (and coalescing counters) were the
    leader's alone, so prompts anchored on the follower's request path never showed. Now each process
    keeps its counters beside its metrics file and the leader adds them up."""

    def status() -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(router.url + "/admin/status", timeout=5).json()
        return doc

    leader = conn_to(router.port, 0)
    assert generate(leader, "warm up: " + "a cached prompt of the leader " * 8)[0] == 200
    before = status()["kv_events"]["first_sight"]["anchored"]
    follower = conn_to(router.port, 1)
    for i in range(3):  # new to every worker: anchored on the follower's request path
        assert generate(follower, f"{i} first sight on the follower, prompt number {i}: " + "words of it " * 20)[0] == 200
    got = wait_for(lambda: (d := status())["kv_events"]["first_sight"]["anchored"] >= before + 3 and d, 10)
    assert got, status()["kv_events"]
    assert got["counters_processes"] == 2 and {"promoted", "rerouted", "holding"} <= set(got["coalesce"])


def kv_blocks(conn: http.client.HTTPConnection) -> dict[str, float]:
    """Per prefill, the blocks the exact index of the process `conn` reaches holds (its own live samples
    in the merged /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    index = str(health(conn)["process"]["index"])
    return {s.labels["worker"]: s.value for f in text_string_to_metric_families(text)
            if f.name == "inferctl_router_kv_blocks" for s in f.samples
            if s.labels.get("router_process") == index}


def test_a_prompt_cached_through_one_process_is_routed_to_the_same_prefill_by_the_other(
        router: Router, kv_cluster: ThreadedSimCluster) -> None:
    """Both processes hold the same exact index (KV events): a prompt first sent through the leader
    goes to the prefill that cached it when it comes again through the follower."""
    from tests.router.kvindex.test_events_router import tree_blocks

    prefills = [w for w in kv_cluster.workers if w.spec.role == "prefill"]
    c0, c1 = conn_to(router.port, 0), conn_to(router.port, 1)
    for i in range(6):
        text = f"Consistency check {i}: " + f"a long shared context number {i} " * 40
        mark = len(router.logs())
        assert generate(c0, text)[0] == 200
        # the KV events of the first request reached the follower: its index holds every prefill's tree
        # (a fixed 0.3 s was not always enough on a loaded machine)
        want = {w.url: float(len(tree_blocks(w))) for w in prefills}
        assert wait_for(lambda want=want: kv_blocks(c1) == want, 10), (kv_blocks(c1), want)
        assert generate(c1, text + " and a follow-up")[0] == 200

        def both(mark: int = mark) -> list[dict[str, Any]]:
            got = [d for d in router.logs()[mark:] if d.get("msg") == "request done"]
            return got if len(got) == 2 else []

        done = wait_for(both, 5)
        assert done and [d["router_process"] for d in done] == [0, 1], done
        assert done[0]["prefill"] == done[1]["prefill"], [
            {k: d.get(k) for k in ("router_process", "prefill", "reason", "predicted_tokens", "cached_tokens")}
            for d in done]
    c0.close()
    c1.close()


def test_a_burst_split_over_both_processes_computes_its_prefix_once() -> None:
    """A new prefix computing on a prefill through one process: the same prefix through the other
    process goes to that prefill and waits for it (the flight board, router/fleet/shared_flights.py; the
    processes hash alike because the supervisor gives them one PYTHONHASHSEED), then hits. Before the
    board the follower process knew nothing of the leader's prefill and placed its request by load."""
    kw: dict[str, Any] = {"time_scale": 1.0, "speculative": False, "prefill_mfu": 0.02,
                          "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    cluster = start_cluster_in_thread([WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
                                       WorkerSpec("prefill", kv_events_config=kv_config(), **kw),
                                       WorkerSpec("decode", **kw)])
    r = Router(cluster, 2)

    def prefilling() -> bool:  # the leader is on a prefill (the shared in-flight load, as the leader counts it)
        doc = httpx.get(r.url + "/admin/workers", headers={"Connection": "close"}, timeout=5).json()
        return any(w["inflight"] for w in doc["workers"] if w["role"] == "prefill")

    try:
        system = "A tenant's new system prompt. " + " ".join(f"rule {i}: answer politely" for i in range(300))
        c1, c0 = conn_to(r.port, 1), conn_to(r.port, 0)
        mark = len(r.logs())
        leader = threading.Thread(target=generate, args=(c1, system + " first question"))
        leader.start()
        assert wait_for(prefilling, 10)
        status, _ = generate(c0, system + " second question")
        leader.join(30)
        assert status == 200

        def done() -> list[dict[str, Any]]:
            got = [d for d in r.logs()[mark:] if d.get("msg") == "request done"]
            return got if len(got) == 2 else []

        got = wait_for(done, 10)
        assert got, r.logs()[-10:]
        by = {d["router_process"]: d for d in got}
        assert set(by) == {0, 1}, got
        assert by[0].get("coalesced") == "landed" and by[0]["prefill"] == by[1]["prefill"], got
        assert by[0]["cached_tokens"] > 1000, got
        c0.close()
        c1.close()
        status = httpx.get(r.url + "/admin/status", headers={"Connection": "close"}, timeout=5).json()["coalesce"]
        assert status["board"]["foreign_processes"] == [], status
    finally:
        assert r.stop() == 0
    off = Router(cluster, 2, "--no-share-flights")  # each process on its own again
    try:
        assert "board" not in httpx.get(off.url + "/admin/status", headers={"Connection": "close"},
                                        timeout=5).json()["coalesce"]
    finally:
        assert off.stop() == 0
        cluster.stop()


def test_admin_changes_are_in_force_in_both_processes_within_a_second(router: Router,
                                                                       kv_cluster: ThreadedSimCluster) -> None:
    c0, c1 = conn_to(router.port, 0), conn_to(router.port, 1)
    text = "You are the billing assistant of the cluster. Answer in one line. " * 8
    # registered through the follower's front (relayed to the leader's admin API)
    c1.request("POST", "/admin/prefixes", json.dumps({"name": "billing", "text": text}),
               {"Content-Type": "application/json"})
    resp = c1.getresponse()
    assert resp.status == 201, resp.read()
    resp.read()
    t0 = time.monotonic()
    v0 = wait_for(lambda: health(c0)["process"]["state_version"], 2, 0.01)
    assert wait_for(lambda: health(c1)["process"]["state_version"] >= v0, 1.0, 0.01)
    assert time.monotonic() - t0 < 1.0
    # in force: once the leader warmed it, the follower routes the prefix's traffic as the prefix's
    assert wait_for(lambda: any(r["warm"] for p in httpx.get(router.url + "/admin/prefixes").json()["prefixes"]
                                for r in p["replicas"]), 20)
    t1 = time.monotonic()

    def named_on_follower() -> bool:
        status, _ = generate(c1, text + " Q: my invoice?")
        assert status == 200
        return any(d.get("msg") == "request done" and d.get("router_process") == 1
                   and str(d.get("reason", "")).startswith("named_prefix") for d in router.logs())

    assert wait_for(named_on_follower, 1.0, 0.05)
    assert time.monotonic() - t1 < 1.0
    # a drain made through the admin API: the follower stops routing to that prefill within 1 s
    pre = [w.url for w in kv_cluster.workers if w.spec.role == "prefill"]
    r = httpx.post(router.url + "/admin/workers/drain", json={"url": pre[0], "timeout_s": 0}, timeout=10)
    assert r.status_code == 200
    time.sleep(1.0)
    mark = len(router.logs())
    for i in range(10):
        assert generate(c1, f"after the drain {i}")[0] == 200
    done = [d for d in router.logs()[mark:] if d.get("msg") == "request done" and d.get("router_process") == 1]
    assert len(done) == 10 and all(d["prefill"] == pre[1] for d in done), done
    assert httpx.post(router.url + "/admin/workers/drain", json={"url": pre[0], "drain": False}).status_code == 200
    c0.close()
    c1.close()


def test_a_killed_follower_is_restarted_and_the_leader_loses_nothing(router: Router) -> None:
    c1 = conn_to(router.port, 1)
    old_pid = health(c1)["process"]["pid"]
    leaders = [conn_to(router.port, 0) for _ in range(3)]
    results: list[tuple[int, bytes]] = []
    threads = [threading.Thread(target=lambda c=c: results.append(generate(c, "count to many", 200, stream=True)))
               for c in leaders]
    for t in threads:
        t.start()
    time.sleep(0.3)
    os.kill(old_pid, signal.SIGKILL)
    for t in threads:
        t.join(60)
    assert [s for s, _ in results] == [200, 200, 200]
    assert all(b"[DONE]" in body for _, body in results)

    def new_follower() -> int | None:
        try:
            conn = conn_to(router.port, 1, tries=50)
        except (AssertionError, OSError):
            return None
        pid = health(conn)["process"]["pid"]
        ok = generate(conn, "after the restart")[0] == 200
        conn.close()
        return pid if pid != old_pid and ok else None

    assert wait_for(new_follower, 30, 0.2)
    assert any(d.get("msg") == "router process exited: starting it again" and d.get("router_process") == 1
               for d in router.logs())
    # its row was zeroed: the dead process's requests no longer count as load
    assert wait_for(lambda: not any(w["inflight"] for w in httpx.get(router.url + "/admin/workers").json()["workers"]))


def test_a_killed_leader_comes_back_with_the_runtime_state(router: Router) -> None:
    """The leader owns the admin state; a restarted one adopts its last snapshot, so a prefix registered
    at runtime survives, and the follower serves throughout."""
    text = "You are the on-call assistant. Keep answers short. " * 4
    assert httpx.post(router.url + "/admin/prefixes", json={"name": "oncall", "text": text}).status_code == 201
    c0 = conn_to(router.port, 0)
    old = health(c0)["process"]
    time.sleep(0.5)  # the snapshot is written within 0.1 s
    os.kill(old["pid"], signal.SIGKILL)
    c1 = conn_to(router.port, 1)
    assert generate(c1, "served by the follower meanwhile")[0] == 200

    def back() -> bool:
        try:
            conn = conn_to(router.port, 0, tries=50)
        except (AssertionError, OSError):
            return False
        doc = health(conn)["process"]
        conn.close()
        return bool(doc["pid"] != old["pid"] and doc["state_version"] > old["state_version"])

    assert wait_for(back, 30, 0.2)
    names = wait_for(lambda: {p["name"] for p in httpx.get(router.url + "/admin/prefixes").json()["prefixes"]}
                     >= {"oncall"}, 10)
    assert names
    assert any(d.get("msg") == "leader adopted the last snapshot" for d in router.logs())


def test_a_change_acknowledged_just_before_the_leader_dies_is_not_lost(router: Router) -> None:
    """The snapshot was written by a 100 ms loop: a leader killed within 100 ms of a 201 lost the change."""
    c0 = conn_to(router.port, 0)
    old = health(c0)["process"]
    c0.request("POST", "/admin/prefixes", json.dumps({"name": "lastword", "text": "Say the last word. " * 8}),
               {"Content-Type": "application/json"})
    resp = c0.getresponse()
    assert resp.status == 201, resp.read()
    os.kill(old["pid"], signal.SIGKILL)  # right after the answer
    c0.close()
    # meanwhile the follower answers the admin API with 503 and Retry-After (it was a 500)
    c1 = conn_to(router.port, 1)
    c1.request("GET", "/admin/status")
    resp = c1.getresponse()
    body = resp.read()
    assert (resp.status, resp.getheader("Retry-After")) == (503, "2"), body
    c1.close()

    def back() -> bool:
        try:
            conn = conn_to(router.port, 0, tries=50)
        except (AssertionError, OSError):
            return False
        pid = health(conn)["process"]["pid"]
        conn.close()
        return bool(pid != old["pid"])

    assert wait_for(back, 30, 0.2)
    names = {p["name"] for p in httpx.get(router.url + "/admin/prefixes").json()["prefixes"]}
    assert "lastword" in names, names


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_supervisor_killed_with_9_leaves_no_process_no_files_and_the_port_free(kv_cluster: ThreadedSimCluster) -> None:
    r = Router(kv_cluster, 2)
    ready = next(d for d in r.logs() if d.get("msg") == "router processes ready")
    state_dir, pids = Path(ready["state_dir"]), ready["pids"]
    assert state_dir.is_dir() and (state_dir / "state.json").exists()
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    os.kill(r.proc.pid, signal.SIGKILL)
    r.proc.wait()
    assert wait_for(lambda: all(_gone(p) for p in pids), 30), "orphaned router processes"
    # the last one out removed the directory (the prefix texts of the snapshot, the admin socket)
    assert wait_for(lambda: not state_dir.exists(), 5), sorted(os.listdir(state_dir))
    r.fh.close()
    again = Router(kv_cluster, 2, port=r.port)  # the port is free for the next router
    assert again.stop() == 0


def test_sigterm_during_start_up_stops_everything(kv_cluster: ThreadedSimCluster) -> None:
    from infer_ctl.router.daemon.procs import reserve_port

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="router-procs-", suffix=".log")[1])
    args = [sys.executable, "-m", "infer_ctl", "router", "serve", "--listen", f"127.0.0.1:{port}", "--processes", "2"]
    for w in kv_cluster.workers:
        args += ["--prefill", f"{w.url}@{w.bootstrap_port}"] if w.spec.role == "prefill" else ["--decode", w.url]
    with log.open("wb") as fh:
        proc = subprocess.Popen(args, stderr=fh, env={**os.environ, "PYTHONPATH": os.getcwd()})
        # the supervisor decided and is starting the leader: stop it now
        assert wait_for(lambda: b"router runs several processes" in log.read_bytes(), 60, 0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert "Traceback" not in text and "router processes ready" not in text
    os.close(reserve_port("127.0.0.1", port)[2])  # free: no router process is left holding the port's lock


def test_without_kv_events_the_router_runs_one_process_and_says_why() -> None:
    kw: dict[str, Any] = {"time_scale": TIME_SCALE, "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    cluster = start_cluster_in_thread([WorkerSpec("prefill", **kw), WorkerSpec("decode", **kw)])
    try:
        r = Router(cluster, 2)
        try:
            for _ in range(10):
                conn = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
                assert "process" not in health(conn)  # one plain router process
                assert generate(conn, "hi")[0] == 200
                conn.close()
            line = next(d for d in r.logs() if d.get("msg", "").startswith("router runs one process"))
            assert "publishes no KV events" in line["msg"] and line["requested"] == 2
        finally:
            assert r.stop() == 0
    finally:
        cluster.stop()


def test_sigterm_drains_every_process(kv_cluster: ThreadedSimCluster) -> None:
    r = Router(kv_cluster, 2)
    try:
        conns = [conn_to(r.port, 0), conn_to(r.port, 1)]
        results: list[tuple[int, bytes]] = []
        threads = [threading.Thread(target=lambda c=c: results.append(generate(c, "drain me", 3000, stream=True)))
                   for c in conns]
        for t in threads:
            t.start()
        assert wait_for(lambda: sum(w["inflight"] for w in httpx.get(r.url + "/admin/workers").json()["workers"]
                                    if w["role"] == "decode") == 2, 10, 0.02), (
            httpx.get(r.url + "/admin/workers").json(), results, r.logs()[-10:])
        r.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert [s for s, _ in results] == [200, 200] and all(b"[DONE]" in b for _, b in results)
    finally:
        assert r.stop() == 0
    stopped = [d for d in r.logs() if d.get("msg") == "router stopped"]
    assert {d.get("router_process") for d in stopped} >= {0, 1}
