"""Two independent `inferctl router serve` (two replicas, no shared store), each with two router processes,
over the same simulated PD fleet (3 prefills publishing KV events): a prompt no worker holds, sent to both
at the same moment, is placed on the same prefill by both (its rendezvous home, core/routing/policy.py),
whichever process of each gets it. With the earlier rule (power-of-two over a random pair) each process
picks its own."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import httpx
import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.router.conftest import TIME_SCALE
from tests.router.scaleout.test_processes import Router
from tests.sim.kv_client import kv_config
from tests.waiting import wait_for

#: `router serve` arguments of both routers (`("--miss-placement", "power_of_two")`, the default, shows
#: the split)
ARGS: tuple[str, ...] = ("--miss-placement", "rendezvous")


@pytest.fixture(scope="module")
def fleet() -> Iterator[ThreadedSimCluster]:
    kw = {"time_scale": TIME_SCALE, "bootstrap_timeout_s": 10.0, "waiting_timeout_s": 10.0}
    cluster = start_cluster_in_thread([*(WorkerSpec("prefill", kv_events_config=kv_config(), **kw) for _ in range(3)),
                                       WorkerSpec("decode", **kw)])
    yield cluster
    cluster.stop()


def test_both_routers_place_a_new_prefix_on_one_worker(fleet: ThreadedSimCluster) -> None:
    routers = [Router(fleet, 2, *ARGS), Router(fleet, 2, *ARGS)]
    try:
        rng = random.Random(4)
        words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
        errors: list[object] = []

        def send(url: str, rid: str, text: str) -> None:
            try:
                r = httpx.post(url + "/generate", json={"text": text, "sampling_params": {"max_new_tokens": 2}},
                               headers={"x-request-id": rid, "Connection": "close"}, timeout=30)
                assert r.status_code == 200, r.text
            except Exception as exc:  # reported below
                errors.append(exc)

        n = 10
        for i in range(n):
            text = f"tenant {i} system prompt: " + " ".join(rng.choice(words) for _ in range(400))
            # both at once, twice each (fresh connections: either process of each router may take one)
            ts = [threading.Thread(target=send, args=(r.url, f"p{i}-r{j}-{k}", text))
                  for j, r in enumerate(routers) for k in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
        assert not errors, errors[:3]

        def decisions() -> dict[str, dict[str, str]] | None:
            out: dict[str, dict[str, str]] = {}
            for r in routers:
                for d in r.logs():
                    if d.get("msg") == "request done" and str(d.get("rid", "")).startswith("p"):
                        out[d["rid"]] = d
            return out if len(out) == 4 * n else None

        got = wait_for(decisions, 10)
        assert got, "not every request logged"
        processes = {(rid.split("-")[1], d.get("router_process")) for rid, d in got.items()}
        assert len(processes) >= 3  # both routers, and more than one process among them
        homes = 0
        for i in range(n):
            mine = [d for rid, d in got.items() if rid.startswith(f"p{i}-")]
            assert len({d["prefill"] for d in mine}) == 1, [(d["rid"], d["prefill"], d["reason"]) for d in mine]
            homes += sum(d["reason"] == "home" for d in mine)
        assert homes >= n  # placed as misses (not only followed through the KV events of the first)
        assert len({next(d["prefill"] for rid, d in got.items() if rid.startswith(f"p{i}-")) for i in range(n)}) >= 2
    finally:
        for r in routers:
            r.stop()
