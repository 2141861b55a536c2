"""`inferctl spec control` in advise mode against simulated decodes behind the real router: one round
prints the exact profile change and the one command, records it (router counter, history, state file), and
gives the same advice only once; a pool above the threshold gets none. Bad input is exit 64."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infer_ctl.cli.main import main
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.sshd_harness import free_port

HOSTS = {"pf-01": "127.0.0.51", "dc-01": "127.0.0.52", "dc-02": "127.0.0.53"}


def _profile(ports: dict[str, int], router: str, **spec: Any) -> dict[str, Any]:
    return {
        "name": "advise",
        "nodes": [
            {"name": "pf-01", "host": HOSTS["pf-01"], "connection": "local", "roles": ["prefill"],
             "overrides": {"prefill_port": ports["pf-01"], "bootstrap_port": ports["boot"]}},
            {"name": "dc-01", "host": HOSTS["dc-01"], "connection": "local", "roles": ["decode"],
             "overrides": {"decode_port": ports["dc-01"]}},
            {"name": "dc-02", "host": HOSTS["dc-02"], "connection": "local", "roles": ["decode"],
             "overrides": {"decode_port": ports["dc-02"]}},
        ],
        "models": {"target": {"path": "sim-llama-3.1-70b", "tp": 8},
                   "draft": {"path": "/m/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1,
                             "num_draft_tokens": 4}},
        "router": {"listen": router.removeprefix("http://")},
        "speculative": {"control": "advise", "window_requests": 40, "min_requests": 20, "sustain_s": 0, **spec},
    }


def test_advise_once_per_setting_with_the_profile_change_and_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ports = {"pf-01": free_port(HOSTS["pf-01"]), "boot": free_port(HOSTS["pf-01"]),
             "dc-01": free_port(HOSTS["dc-01"]), "dc-02": free_port(HOSTS["dc-02"])}
    specs = [WorkerSpec("prefill", host=HOSTS["pf-01"], port=ports["pf-01"], bootstrap_port=ports["boot"], time_scale=0.05),
             WorkerSpec("decode", host=HOSTS["dc-01"], port=ports["dc-01"], spec_alpha=0.8, time_scale=0.05),
             WorkerSpec("decode", host=HOSTS["dc-02"], port=ports["dc-02"], spec_alpha=0.42, time_scale=0.05)]
    with start_cluster_in_thread(specs) as cluster:
        pre = cluster.workers[0]
        router = start_router_in_thread(router_config(prefill=[(pre.url, ports["boot"])],
                                                      decode=[w.url for w in cluster.workers[1:]],
                                                      health_interval_s=0.3, spec_window_requests=40))
        try:
            path = tmp_path / "p.yaml"
            path.write_text(yaml.safe_dump(_profile(ports, router.url)))

            async def load() -> None:
                sem = asyncio.Semaphore(12)
                async with httpx.AsyncClient(timeout=60) as c:
                    async def one(i: int) -> None:
                        async with sem:
                            r = await c.post(router.url + "/generate", json={
                                "text": f"q{i}", "sampling_params": {"max_new_tokens": 32}})
                            assert r.status_code == 200
                    await asyncio.gather(*(one(i) for i in range(120)))

            asyncio.run(load())
            history, state = tmp_path / "h.jsonl", tmp_path / "state.json"
            args = ["spec", "control", "-p", str(path), "--once", "--history", str(history), "--state", str(state)]
            assert main([*args, "--json"]) == 1
            doc = json.loads(capsys.readouterr().out)
            assert doc["mode"] == "advise"
            assert doc["skipped"] is None and doc["skipped_rounds"] == 0  # the round ran
            # every pool's decision, "no change" included (--once --advise printed nothing without an action)
            pools = {p["pool"]: p["decision"] for p in doc["pools"]}
            assert pools["dc-01"] == "no change" and pools["dc-02"].startswith("advise: num_steps 2")
            actions = doc["actions"]
            assert [(a["action"], a["pool"]) for a in actions] == [("alert", "dc-02"), ("advise", "dc-02")]
            advice = actions[1]
            assert (advice["from_steps"], advice["num_steps"]) == (3, 2)  # alpha 0.42 at c 0.1: 2 steps
            assert "    - name: dc-02\n      nodes: [dc-02]\n      num_steps: 2\n" in advice["profile_change"]
            assert advice["command"] == f"inferctl launch -p {path} --rolling --role decode --nodes dc-02"
            metrics = httpx.get(router.url + "/metrics").text
            assert 'inferctl_router_spec_actions_total{action="advise",pool="dc-02"} 1.0' in metrics
            assert [json.loads(x)["action"] for x in history.read_text().splitlines()] == ["alert", "advise"]
            assert state.exists()
            # the same advice is not repeated by the same process; a new process repeats it (it is not a
            # change, so there is no cool-down to honour), and the servers were not touched either way
            assert main([*args]) == 1
            out = capsys.readouterr().out
            assert "advise pool dc-02" in out and "apply with: inferctl launch" in out
            assert "pool dc-01: no change (alpha 0." in out
            info = httpx.get(cluster.workers[2].url + "/server_info").json()
            assert info["internal_states"][0]["speculative_num_steps"] == 3
        finally:
            router.stop()


def test_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ports = {"pf-01": 30000, "boot": 8998, "dc-01": 30001, "dc-02": 30001}
    path = tmp_path / "off.yaml"
    data = _profile(ports, "http://127.0.0.1:1")
    data["speculative"]["control"] = "off"
    path.write_text(yaml.safe_dump(data))
    assert main(["spec", "control", "-p", str(path), "--once"]) == 64
    assert "speculative.control is off" in capsys.readouterr().err
    data["speculative"]["control"] = "advise"
    path.write_text(yaml.safe_dump(data))
    assert main(["spec", "control", "-p", str(path), "--interval", "0"]) == 64
    for bad in ("nan", "inf"):  # refused before the router is asked (it is not running: that would be 3)
        assert main(["spec", "control", "-p", str(path), "--interval", bad]) == 64
        assert f"--interval must be a finite number > 0, got {bad}" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["spec", "control", "-p", str(path), "--once"]) == 3  # the router is not running
    assert "not reachable" in capsys.readouterr().err
