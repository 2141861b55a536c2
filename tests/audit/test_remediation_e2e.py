"""`audit --remediate` end to end: a simulated fleet (simulated SGLang workers on each node's own loopback
address behind the real router), nodes on real sshd with stand-in nvidia-smi/journalctl serving real
captures. A GPU fault (XID 79 on dc-01) -> the audit drains dc-01's decode from the router while
non-streaming requests keep coming (none fails) and runs the site hook -> clean audits -> dc-01 returns.

What is real: sshd, the SSH fleet, the node-side gatherer, the audit CLI, the router (its admin API and
PD routing), the simulated workers' HTTP API and PD bootstrap, the hook (a process run without a shell),
the textfile and the history. Stand-ins: nvidia-smi/journalctl (tests/audit/test_audit_e2e.py).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.router.daemon.embed import router_config, start_router_in_thread
from infer_ctl.sim.cluster import WorkerSpec, start_cluster_in_thread
from tests.audit.test_audit_e2e import H100, XID79, standin_gpu_node

pytestmark = pytest.mark.ssh

NAMES = ["pf-01", "pf-02", "dc-01", "dc-02"]
ROLES = [["prefill"], ["prefill"], ["decode"], ["decode"]]
PROMPT = "You are a terse assistant for Example Corp. " * 10


class Load:
    """Non-streaming /generate requests through the router from 4 threads until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(4)]

    def _run(self, i: int) -> None:
        n = 0
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                n += 1
                body = {"text": f"user {i} turn {n}: " + PROMPT, "sampling_params": {"max_new_tokens": 8}}
                try:
                    r = client.post(self.url + "/generate", json=body)
                    self.statuses.append(r.status_code)
                    if r.status_code != 200:
                        self.errors.append(r.text[:300])
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)


def audit(capsys: pytest.CaptureFixture[str], profile: Path, hist: Path, prom: Path) -> tuple[int, dict]:
    rc = main(["audit", "-p", str(profile), "--json", "--only", "gpu", "--remediate",
               "--history", str(hist), "--textfile", str(prom)])
    return rc, json.loads(capsys.readouterr().out)


def remediation(doc: dict) -> dict[tuple[str, str], dict]:
    return {(f["check"], f["node"]): f for f in doc["findings"] if f["check"].startswith("remediation.")}


def router_workers(url: str) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(url + "/admin/workers", timeout=10).json()["workers"]}


def test_gpu_fault_drains_the_node_under_load_then_clean_audits_return_it(
        ssh_cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cluster = ssh_cluster(4, names=NAMES, roles=ROLES)
    for name in NAMES:
        standin_gpu_node(cluster, name, H100)
    host = {n: cluster.node(n).host for n in NAMES}
    # the workers listen where the profile says the node's servers are: the node's address and SGLang ports
    specs = [WorkerSpec("prefill", host=host[n], port=30000, bootstrap_port=8998, time_scale=0.05,
                        bootstrap_timeout_s=10, waiting_timeout_s=10) for n in ("pf-01", "pf-02")]
    specs += [WorkerSpec("decode", host=host[n], port=30001, time_scale=0.05, bootstrap_timeout_s=10,
                         waiting_timeout_s=10) for n in ("dc-01", "dc-02")]
    sim = start_cluster_in_thread(specs)
    router = start_router_in_thread(router_config(
        prefill=[(f"http://{host[n]}:30000", 8998) for n in ("pf-01", "pf-02")],
        decode=[f"http://{host[n]}:30001" for n in ("dc-01", "dc-02")], health_interval_s=0.5))
    hook_log = tmp_path / "hook.log"
    hook = tmp_path / "site-hook.sh"
    hook.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s|" "$a"; done >> {hook_log}\necho >> {hook_log}\n')
    hook.chmod(0o755)
    profile = cluster.write_profile(
        tmp_path / "profile.yaml", gpu={"expected_count": 8},
        remediation={"enabled": True, "recovery_audits": 2, "drain_wait_s": 30, "router_url": router.url,
                     "drain_hook": [str(hook), "drain", "NodeName={node}", "Reason={reason}"],
                     "return_hook": [str(hook), "resume"]})
    hist, prom = tmp_path / "audit.jsonl", tmp_path / "tf" / "inferctl.prom"
    dc01 = f"http://{host['dc-01']}:30001"
    try:
        with Load(router.url) as load:
            # healthy fleet: nothing to do, the state is recorded empty
            rc, doc = audit(capsys, profile, hist, prom)
            assert rc == 0 and remediation(doc) == {}
            time.sleep(0.5)
            assert router_workers(router.url)[dc01]["requests"] > 0  # dc-01 takes traffic

            # GPU fault: XID 79 on dc-01 (its GPU2) -> drained from the router under load
            standin_gpu_node(cluster, "dc-01", H100, klog=XID79)
            rc, doc = audit(capsys, profile, hist, prom)
            assert rc == 2
            drain = remediation(doc)[("remediation.drain", "dc-01")]
            assert drain["status"] == "warn" and drain["code"] and "1 worker(s) drained from the router" in drain["message"]
            assert drain["details"]["workers"] == [dc01] and drain["details"]["inflight_left"] == 0
            assert "gpu.xid GPU2: XID 79" in drain["message"]
            w = router_workers(router.url)[dc01]
            assert w["draining"] is True and w["available"] is False and w["inflight"] == 0
            served = w["requests"]
            time.sleep(1.0)
            assert router_workers(router.url)[dc01]["requests"] == served  # no new request reached it
            # the hook ran once, without a shell: the reason with its spaces and colons is one argument
            (line,) = hook_log.read_text().splitlines()
            args = line.split("|")[:-1]
            assert args[:2] == ["drain", "NodeName=dc-01"] and len(args) == 3
            assert args[2].startswith("Reason=inferctl: gpu.xid GPU2: XID 79")

            # still failing: not drained again, no second hook run
            rc, doc = audit(capsys, profile, hist, prom)
            rec = remediation(doc)[("remediation.recovery", "dc-01")]
            assert "still failing" in rec["message"] and ("remediation.drain", "dc-01") not in remediation(doc)
            assert len(hook_log.read_text().splitlines()) == 1

            # the operator reboots it: the kernel log is clean; one clean audit (1/2), then it returns
            standin_gpu_node(cluster, "dc-01", H100, klog="")
            rc, doc = audit(capsys, profile, hist, prom)
            assert rc == 1 and remediation(doc)[("remediation.recovery", "dc-01")]["message"].endswith("clean audit 1/2")
            assert router_workers(router.url)[dc01]["draining"] is True
            rc, doc = audit(capsys, profile, hist, prom)
            back = remediation(doc)[("remediation.returned", "dc-01")]
            assert rc == 0 and back["status"] == "ok" and "after 2 clean audits" in back["message"]
            assert router_workers(router.url)[dc01]["draining"] is False
            time.sleep(1.0)
            assert router_workers(router.url)[dc01]["requests"] > served  # routed to again
        # not one non-streaming request failed while the node went out and came back
        assert load.errors == [] and len(load.statuses) > 20 and set(load.statuses) == {200}
        assert hook_log.read_text().splitlines()[1] == "resume|dc-01|"
        # every step in the history and as a counter in the textfile
        states = [json.loads(x).get("remediation") for x in hist.read_text().splitlines()]
        assert [sorted(s["drained"]) for s in states] == [[], ["dc-01"], ["dc-01"], ["dc-01"], []]
        assert states[-1]["counters"] == {"drain": {"dc-01": 1}, "return": {"dc-01": 1}}
        text = prom.read_text()
        assert 'inferctl_remediation_actions_total{action="drain",node="dc-01"} 1' in text
        assert 'inferctl_remediation_actions_total{action="return",node="dc-01"} 1' in text
        assert "# TYPE inferctl_remediation_actions_total counter" in text
        assert "inferctl_remediation_drained{" not in text
    finally:
        router.stop()
        sim.stop()


def test_remediate_refuses_without_history_or_when_disabled(ssh_cluster, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cluster = ssh_cluster(2, names=["pf-01", "dc-01"], roles=[["prefill"], ["decode"]])
    off = cluster.write_profile(tmp_path / "off.yaml")
    on = cluster.write_profile(tmp_path / "on.yaml", remediation={"enabled": True})
    assert main(["audit", "-p", str(on), "--only", "gpu", "--remediate"]) == 64
    assert "--remediate needs --history" in capsys.readouterr().err
    assert main(["audit", "-p", str(off), "--only", "gpu", "--remediate", "--history", str(tmp_path / "h")]) == 64
    assert "remediation.enabled is false" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()
