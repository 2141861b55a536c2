"""`inferctl spec control` with `speculative.control: act`, end to end: real sshd nodes (pf-01, dc-01,
dc-02), the stand-in SGLang (a simulated worker launched from the rendered command line), the real router
in front, non-streaming load throughout. dc-02's acceptance drops below the break-even of 3 steps; one
controller round relaunches dc-02 only (drained from the router first) with the recommended num_steps,
records the action (router counter, audit history) and no request fails."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from infer_ctl.core.sglang import instances
from infer_ctl.profile.load import load_profile
from tests.launch.standin_cluster import pd_profile, run_cli, standin_servers, write_yaml
from tests.launch.test_rolling_e2e import Load

pytestmark = [pytest.mark.ssh, pytest.mark.slow]

DRAFT = {"path": "/models/eagle3", "algorithm": "EAGLE3", "num_steps": 3, "eagle_topk": 1, "num_draft_tokens": 4}


def _window(router: str, url: str) -> dict[str, Any]:
    for d in httpx.get(router + "/admin/spec", trust_env=False).json()["decodes"]:
        if d["url"] == url:
            return dict(d)
    return {}


def test_act_relaunches_only_the_drifted_decode_with_the_recommended_steps(
    ssh_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from infer_ctl.router.daemon.embed import router_config, start_router_in_thread

    cluster = ssh_cluster(3, names=["pf-01", "dc-01", "dc-02"], roles=[["prefill"], ["decode"], ["decode"]])
    model = tmp_path / "models" / "Llama-3.1-70B-Instruct"
    prof, data = pd_profile(cluster, tmp_path, models={"target": {"path": str(model), "tp": 8}, "draft": DRAFT},
                            extra_args={"decode": ["--max-running-requests", "128"]})
    data["speculative"] = {"control": "act", "window_requests": 20, "min_requests": 10, "sustain_s": 0,
                           "cooldown_s": 600, "cost_ratio": 0.1}
    write_yaml(prof, data)
    p = str(prof)
    history = tmp_path / "audit.jsonl"
    handle = None
    try:
        code, doc, err = run_cli(capsys, "launch", "-p", p, "--json")
        assert code == 0, (doc, err)
        profile = load_profile(p)
        leaders = {i.name: i for i in instances(profile) if i.is_leader}
        handle = start_router_in_thread(router_config(
            prefill=[(i.url, i.bootstrap_port) for i in leaders.values() if i.role == "prefill"],
            decode=[i.url for i in leaders.values() if i.role == "decode"], health_interval_s=0.3,
            spec_window_requests=20))
        data["router"] = {"listen": handle.url.removeprefix("http://")}
        write_yaml(prof, data)
        dc1, dc2, pf1 = leaders["dc-01-decode"], leaders["dc-02-decode"], leaders["pf-01-prefill"]
        before = {n: standin_servers(leaders[n].port) for n in leaders}

        load = Load(handle.url, clients=4)
        for t in load.threads:
            t.start()
        try:
            # dc-02's draft stops fitting the traffic: alpha 0.15, below 3 steps' break-even (~0.23)
            r = httpx.post(dc2.url + "/sim/spec/alpha", json={"domain": "default", "alpha": 0.15}, trust_env=False)
            assert r.status_code == 200, r.text
            deadline = time.monotonic() + 60
            while True:
                w = _window(handle.url, dc2.url).get("window", {})
                if w.get("requests", 0) >= 20 and (w.get("alpha") or 1) < 0.2:
                    break
                assert time.monotonic() < deadline, w
                time.sleep(0.2)
            code, doc, err = run_cli(capsys, "spec", "control", "-p", p, "--once", "--history", str(history),
                                     "--state", str(tmp_path / "state.json"), "--json")
        finally:
            time.sleep(1.0)  # load after the relaunch too
            load.stop.set()
            for t in load.threads:
                t.join(35)
        assert code == 1, (doc, err)  # a pool changed
        actions = doc["actions"]
        assert [(a["action"], a["pool"]) for a in actions] == [("alert", "dc-02"), ("relaunch", "dc-02")], actions
        relaunch = actions[1]
        assert (relaunch["from_steps"], relaunch["num_steps"]) == (3, 1)
        assert relaunch["result"]["ok"] and relaunch["result"]["restarted"] == ["dc-02-decode"], relaunch

        assert not load.failures, f"{len(load.failures)} requests failed, e.g. {load.failures[:3]}"
        assert load.ok > 20
        # only the drifted pool changed: dc-02 runs 1 step in a new process, the others are the same processes
        info = httpx.get(dc2.url + "/server_info", trust_env=False).json()
        assert info["internal_states"][0]["speculative_num_steps"] == 1
        assert info["speculative_num_draft_tokens"] == 2
        after = {n: standin_servers(leaders[n].port) for n in leaders}
        assert after[dc1.name] == before[dc1.name] and after[pf1.name] == before[pf1.name]
        assert after[dc2.name] != before[dc2.name]
        assert httpx.get(dc1.url + "/server_info", trust_env=False).json()["internal_states"][0][
            "speculative_num_steps"] == 3
        # recorded: the router's counter and log, and the audit history (a line the audit's diff skips)
        metrics = httpx.get(handle.url + "/metrics", trust_env=False).text
        assert 'inferctl_router_spec_actions_total{action="relaunch",pool="dc-02"} 1.0' in metrics
        lines = [json.loads(x) for x in history.read_text().splitlines()]
        assert [(x["kind"], x["action"]) for x in lines] == [("spec_action", "alert"), ("spec_action", "relaunch")]
        # the router drained dc-02 before it went down, and took it back
        workers = {w["url"]: w for w in httpx.get(handle.url + "/admin/workers", trust_env=False).json()["workers"]}
        assert workers[dc2.url]["healthy"] and not workers[dc2.url]["draining"]

        # a second round within the cool-down changes nothing, even though dc-02 still accepts little
        code, doc, _ = run_cli(capsys, "spec", "control", "-p", p, "--once", "--history", str(history),
                               "--state", str(tmp_path / "state.json"), "--json")
        assert [a["action"] for a in doc["actions"] if a["action"] != "alert"] == []
    finally:
        if handle is not None:
            handle.stop(drain=False)
        run_cli(capsys, "stop", "-p", p, "--json")
