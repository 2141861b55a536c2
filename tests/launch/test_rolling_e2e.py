"""`launch --rolling` on a serving cluster, end to end over real sshd, behind the real inferctl router.

Real: OpenSSH servers on loopback (one per node), the SSH connector and Fleet, the node-side shell that
starts/stops processes, the inferctl router (PD proxy, retries, admin API) and HTTP clients loading it.
Stand-in: `<venv>/0.5.23/bin/python` is tests/launch/standin_sglang.py (an inferctl simulated worker in
place of SGLang; no GPUs); for a server over two nodes it forms its group over TCP like torch's store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.core.sglang import instances
from infer_ctl.profile.load import load_profile
from tests.launch.standin_cluster import pd_profile, run_cli, standin_servers, write_yaml
from tests.sshd_harness import free_port

pytest.importorskip("infer_ctl.sim.server", reason="the simulator (infer_ctl.sim) is not available")
pytestmark = [pytest.mark.ssh, pytest.mark.slow]

SAMPLE_S = 0.1


class Load:
    """Bounded load: `clients` threads, each sending one non-streaming /generate at a time."""

    def __init__(self, url: str, clients: int = 3) -> None:
        self.url = url
        self.stop = threading.Event()
        self.ok = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, i: int) -> None:
        n = 0
        with httpx.Client(timeout=30, trust_env=False) as http:
            while not self.stop.is_set():
                n += 1
                body = {"text": f"client {i} request {n}: tell me about rolling restarts",
                        "sampling_params": {"max_new_tokens": 8}}  # fmt: skip
                try:
                    r = http.post(self.url + "/generate", json=body)
                    outcome = None if r.status_code == 200 else f"HTTP {r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as exc:
                    outcome = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if outcome is None:
                        self.ok += 1
                    else:
                        self.failures.append(outcome)
                time.sleep(0.02)


class Sampler:
    """Every 100 ms: how many prefills and decodes serve, i.e. are in the router's pool, healthy and
    available there, AND answer /health themselves right now."""

    def __init__(self, router_url: str) -> None:
        self.router_url = router_url
        self.stop = threading.Event()
        self.samples: list[tuple[float, int, int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=0.5, trust_env=False) as http:
            while not self.stop.is_set():
                t = time.monotonic()
                count = {"prefill": 0, "decode": 0}
                try:
                    workers = http.get(self.router_url + "/admin/workers").json()["workers"]
                except httpx.HTTPError:
                    workers = []
                for w in workers:
                    if not (w["healthy"] and w["available"]):
                        continue
                    try:
                        up = http.get(w["url"] + "/health").status_code == 200
                    except httpx.HTTPError:
                        up = False
                    count[w["role"]] += up
                self.samples.append((t, count["prefill"], count["decode"]))
                self.stop.wait(max(0.0, SAMPLE_S - (time.monotonic() - t)))

    def minimum(self) -> tuple[int, int]:
        return min(s[1] for s in self.samples), min(s[2] for s in self.samples)


@pytest.fixture
def router_for(tmp_path: Path) -> Iterator[Any]:
    from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

    handles = []

    def start(prof_path: Path) -> Any:
        profile = load_profile(str(prof_path))
        pd = [i for i in instances(profile) if i.is_leader]
        handle = start_router_in_thread(
            router_config(
                prefill=[(i.url, i.bootstrap_port) for i in pd if i.role == "prefill"],
                decode=[i.url for i in pd if i.role == "decode"],
            )
        )
        handles.append(handle)
        return handle

    yield start
    for h in handles:
        h.stop(drain=False)


def test_rolling_restart_of_2_prefills_2_decodes_under_load_drops_nothing(
    ssh_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], router_for: Any
) -> None:
    cluster = ssh_cluster(4, names=["pf-01", "pf-02", "dc-01", "dc-02"],
                          roles=[["prefill"], ["prefill"], ["decode"], ["decode"]])  # fmt: skip
    prof, data = pd_profile(cluster, tmp_path)
    p = str(prof)
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 0, (doc, err)
        handle = router_for(prof)
        data["router"] = {"listen": handle.url.removeprefix("http://")}
        write_yaml(prof, data)

        load, sampler = Load(handle.url), Sampler(handle.url)
        sampler.thread.start()
        for t in load.threads:
            t.start()
        time.sleep(1.0)  # load and samples before the restart too
        started = time.monotonic()
        try:
            code, doc, err = run_cli(capsys, "launch", "-p", p, "--json", "--rolling")
        finally:
            time.sleep(1.0)
            load.stop.set()
            sampler.stop.set()
            for t in load.threads:
                t.join(35)
            sampler.thread.join(5)
        took = time.monotonic() - started
        min_prefill, min_decode = sampler.minimum()
        with capsys.disabled():  # the record docs/launch.md quotes (pytest -s shows it)
            print(
                f"\nrolling restart 2P+2D: {took:.1f} s, {load.ok} requests ok, {len(load.failures)} failed, "
                f"{len(sampler.samples)} samples every {SAMPLE_S * 1000:.0f} ms, "
                f"min serving prefills {min_prefill}, decodes {min_decode}"
            )
        assert not load.failures, f"{len(load.failures)} requests failed, e.g. {load.failures[:3]}"
        assert load.ok > 20
        assert len(sampler.samples) > took / SAMPLE_S / 2
        assert (min_prefill, min_decode) >= (1, 1), "a role had no serving server during the restart"
        assert code == 0, (doc, err)
        rows = {r["instance"]: r for r in doc["results"]}
        assert {n: (r["action"], r["state"]) for n, r in rows.items()} == {
            n: ("restarted", "ready") for n in ("pf-01-prefill", "pf-02-prefill", "dc-01-decode", "dc-02-decode")
        }
        assert {r["router"] for r in rows.values()} == {"removed from the router; re-added to the router"}

        # the restart really took servers out: a prefill and a decode were each out of service once
        assert min(s[1] for s in sampler.samples) < 2 and min(s[2] for s in sampler.samples) < 2
        workers = httpx.get(handle.url + "/admin/workers", trust_env=False).json()["workers"]
        assert sorted((w["role"], w["healthy"]) for w in workers) == [
            ("decode", True), ("decode", True), ("prefill", True), ("prefill", True)
        ]
    finally:
        run_cli(capsys, "stop", "-p", p, "--json")


def test_rolling_with_max_unavailable_restarts_two_of_three_prefills_together(
    ssh_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-unavailable 5 with three prefills: two at a time (one keeps serving), then the third."""
    cluster = ssh_cluster(4, names=["pf-01", "pf-02", "pf-03", "dc-01"],
                          roles=[["prefill"], ["prefill"], ["prefill"], ["decode"]])  # fmt: skip
    prof, _data = pd_profile(cluster, tmp_path)
    p = str(prof)
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 0, (doc, err)
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json", "--rolling", "--role", "prefill",
                                 "--max-unavailable", "5")  # fmt: skip
        assert code == 0, (doc, err)
        assert [r["instance"] for r in doc["results"]] == ["pf-01-prefill", "pf-02-prefill", "pf-03-prefill"]
        steps = doc["rolling_steps"]
        assert steps == [["pf-01-prefill", "pf-02-prefill"], ["pf-03-prefill"]]
    finally:
        run_cli(capsys, "stop", "-p", p, "--json")


def test_a_server_over_two_nodes_restarts_all_its_ranks_together(
    ssh_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """tp16 decode over two 8-GPU nodes: one server, two ranks. A change on rank 1's node alone, and a
    rolling restart, restart both ranks; restarted rank by rank, rank 0 never becomes healthy."""
    cluster = ssh_cluster(3, names=["pf-01", "dc-01", "dc-02"], roles=[["prefill"], ["decode"], ["decode"]])
    dist = free_port(cluster.node("dc-01").host)
    prof, data = pd_profile(cluster, tmp_path, gpus=8, prefill={"tp": 8}, decode={"tp": 16},
                            dist_init_port=dist - 1)  # fmt: skip  (decode uses dist_init_port + 1)
    data["sglang"]["lifecycle"]["start_timeout_s"] = 15
    write_yaml(prof, data)
    p = str(prof)
    decode_port = data["nodes"][1]["overrides"]["decode_port"]
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 0, (doc, err)
        rows = {r["instance"]: r for r in doc["results"]}
        assert (rows["dc-02-decode"]["action"], rows["dc-02-decode"]["state"]) == ("started", "follower")
        assert rows["dc-01-decode"]["state"] == "ready"

        # a flag changed on rank 1's node only: the whole server restarts, not rank 1 alone
        data["nodes"][2]["overrides"]["extra_args"] = ["--log-level", "info"]
        write_yaml(prof, data)
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 0, (doc, err)
        rows = {r["instance"]: r for r in doc["results"]}
        assert rows["dc-01-decode"]["action"] == "restarted" and rows["dc-01-decode"]["state"] == "ready"
        assert rows["dc-02-decode"]["action"] == "restarted"
        assert rows["pf-01-prefill"]["action"] == "unchanged"

        # --rolling, and a selection naming rank 0's node only: still both ranks, in one step
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json", "--rolling", "--nodes", "dc-01")
        assert code == 0, (doc, err)
        assert {r["instance"]: (r["action"], r["state"]) for r in doc["results"]} == {
            "dc-01-decode": ("restarted", "ready"),
            "dc-02-decode": ("restarted", "follower"),
        }
        assert doc["rolling_steps"] == [["dc-01-decode", "dc-02-decode"]]
        code, doc, _ = run_cli(capsys, "status", "-p", p, "--json")
        assert code == 0, doc
        assert len(standin_servers(decode_port)) == 1  # rank 0; rank 1 serves no HTTP port
    finally:
        code, doc, _ = run_cli(capsys, "stop", "-p", p, "--nodes", "dc-02", "--json")
    # stopping one rank's node stops the whole server
    assert {r["instance"] for r in doc["results"]} == {"dc-01-decode", "dc-02-decode"}, doc
    run_cli(capsys, "stop", "-p", p, "--json")
