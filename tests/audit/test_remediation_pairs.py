"""audit --remediate gives the router each prefill x decode pair's test verdict (checks/remediate.py ->
POST /admin/pairs): the real router in front of simulated workers, the profile's nodes at those workers'
addresses, the findings as a `--pingpong` run reports them (core/fabric/judge.py details)."""

from __future__ import annotations

import httpx

from infer_ctl.checks.remediate import remediate
from infer_ctl.core import remediation as rem
from infer_ctl.core.findings import Finding
from infer_ctl.profile import Profile
from infer_ctl.sim.cluster import start_cluster_in_thread
from tests.router.conftest import pd_router, pd_specs


def pair(status: str, server: str, client: str, message: str, check: str = "fabric.pingpong") -> Finding:
    return Finding.make(status, check, server, f"{server}/mlx5_0 <-> {client}/mlx5_0", message,  # type: ignore[arg-type]
                        details={"server": server, "client": client, "tool": "ibv_rc_pingpong"})


def test_pair_verdicts_are_worst_over_rails_and_tools() -> None:
    v = rem.pair_verdicts([
        pair("ok", "pf-01", "dc-01", "2.1 us"), pair("fail", "pf-01", "dc-01", "retry counter exceeded", "fabric.write_bw"),
        pair("warn", "pf-01", "dc-02", "9 us"), pair("unknown", "pf-02", "dc-01", "could not run"),
        Finding.fail("fabric.pingpong", "dc-03", "dc-03", "dc-03 cannot take part"),  # no pair: no verdict
    ])
    assert v == {("pf-01", "dc-01"): ("fail", "fabric.write_bw: retry counter exceeded"), ("pf-01", "dc-02"): ("ok", None)}


def test_remediate_pushes_pair_verdicts_to_the_router() -> None:
    sim = start_cluster_in_thread(pd_specs(1, 2))
    router = pd_router(sim)
    try:
        pf, d1, d2 = sim.workers
        nodes = [{"name": "pf-01", "host": "127.0.0.1", "port": 2201, "roles": ["prefill"],
                  "overrides": {"prefill_port": pf.port, "bootstrap_port": pf.bootstrap_port}},
                 {"name": "dc-01", "host": "127.0.0.1", "port": 2202, "roles": ["decode"],
                  "overrides": {"decode_port": d1.port}},
                 {"name": "dc-02", "host": "127.0.0.1", "port": 2203, "roles": ["decode"],
                  "overrides": {"decode_port": d2.port}}]
        profile = Profile.model_validate({"name": "p", "nodes": nodes,
                                          "remediation": {"enabled": True, "router_url": router.url}})
        out = remediate(profile, [pair("fail", "pf-01", "dc-01", "transport retry counter exceeded"),
                                  pair("ok", "pf-01", "dc-02", "2.0 us")], None, now="t1")
        assert out.findings == [] and out.counts == {"pair_fail": {"pf-01>dc-01": 1}, "pair_ok": {"pf-01>dc-02": 1}}
        doc = {(p["prefill"], p["decode"]): p for p in httpx.get(router.url + "/admin/pairs").json()["pairs"]}
        bad = doc[(pf.url, d1.url)]
        assert bad["degraded"] and bad["reason"] == "pair_test" and "retry counter exceeded" in bad["pair_test_reason"]
        assert not doc[(pf.url, d2.url)]["degraded"]
        # the next --pingpong run passes: the pair is back
        remediate(profile, [pair("ok", "pf-01", "dc-01", "2.2 us")], out.state, now="t2")
        doc = {(p["prefill"], p["decode"]): p for p in httpx.get(router.url + "/admin/pairs").json()["pairs"]}
        assert not doc[(pf.url, d1.url)]["degraded"]
        # a router that is not there: said once, nothing else breaks
        gone = Profile.model_validate({"name": "p", "nodes": nodes,
                                       "remediation": {"enabled": True, "router_url": "http://127.0.0.1:9"}})
        out = remediate(gone, [pair("fail", "pf-01", "dc-01", "x")], None, now="t3")
        assert [(f.check, f.status.value) for f in out.findings] == [("remediation.router", "unknown")]
    finally:
        router.stop()
        sim.stop()
