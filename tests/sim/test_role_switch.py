"""The simulator's runtime PD role switch, as SGLang 0.5.23 has it (`--enable-pd-role-switch`,
`POST /pd_role_switch`; sglang/srt/disaggregation/role_switch.py, managers/tokenizer_control_mixin.py,
managers/disagg_service.py, entrypoints/http_server.py): the order of the refusals and their exact
bodies, the idle rule, prepare_only, the bootstrap server of every role-switch worker, /server_info's
two views of the role, the metrics' "dynamic" engine type, a failed rebuild, and a real PD request
through a pair whose roles were swapped. Real aiohttp servers on loopback."""

from __future__ import annotations

import concurrent.futures as cf
import random
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.cli.main import main
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.role_switch import RoleSwitchState, SwitchRequest, decide

FAST = 0.02
PREFILL, DECODE, PLAIN, MIXED = range(4)


def _spec(role: str, **kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {"time_scale": FAST, "speculative": False, "enable_pd_role_switch": True,
                            "bootstrap_timeout_s": 3.0, "waiting_timeout_s": 3.0}
    return WorkerSpec(role, **{**base, **kw})  # type: ignore[arg-type]


@pytest.fixture
def fleet() -> Iterator[ThreadedSimCluster]:
    c = start_cluster_in_thread([_spec("prefill"), _spec("decode"), _spec("prefill", enable_pd_role_switch=False),
                                 _spec("mixed")])
    yield c
    c.stop()


def _switch(c: ThreadedSimCluster, i: int, **body: Any) -> httpx.Response:
    return httpx.post(c.urls[i] + "/pd_role_switch", json=body, timeout=10)


def _modes(c: ThreadedSimCluster, i: int) -> tuple[str, str, str]:
    info = httpx.get(c.urls[i] + "/server_info", timeout=5).json()
    live = httpx.get(c.urls[i] + "/model_info", timeout=5).json()["disaggregation_mode"]
    return info["disaggregation_mode"], info["internal_states"][0]["disaggregation_mode"], live


def _expect(r: httpx.Response, status: int, message: str, old: str, new: str, safe: bool) -> None:
    assert r.status_code == status
    assert r.json() == {"rid": None, "http_worker_ipc": None, "success": status == 200, "message": message,
                        "old_role": old, "new_role": new, "safe_to_restore": safe}


def _pd(c: ThreadedSimCluster, prefill: int, decode: int) -> tuple[httpx.Response, httpx.Response]:
    body = {"text": "hello role switch " * 8, "sampling_params": {"max_new_tokens": 4},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": c.workers[prefill].bootstrap_port,
            "bootstrap_room": random.randint(1, 2**62)}
    with cf.ThreadPoolExecutor(2) as ex:
        fp = ex.submit(httpx.post, c.urls[prefill] + "/generate", json=body, timeout=20)
        fd = ex.submit(httpx.post, c.urls[decode] + "/generate", json=body, timeout=20)
        return fp.result(), fd.result()


def test_refusals_in_sglangs_order() -> None:
    def why(**kw: Any) -> str:
        args: dict[str, Any] = {"enabled": True, "mode": "prefill", "idle": True, "state": RoleSwitchState(),
                                "req": SwitchRequest("decode", 1.0), "graph_headroom_gb": 12.0, **kw}
        return decide(**args).message

    # the tokenizer's flag check comes first, then the scheduler's table, then the idle rule, then graphs
    assert why(enabled=False, state=RoleSwitchState(unhealthy=True)) == \
        "--enable-pd-role-switch is not set on this server"
    assert why(state=RoleSwitchState(unhealthy=True), idle=False) == \
        "instance is unhealthy after a failed role switch; restart required"
    assert why(state=RoleSwitchState(in_progress=True)) == "another role switch is already in progress"
    assert why(req=SwitchRequest("")) == "invalid new_role=''"
    assert why(mode="null") == "instance is not running in PD disaggregation mode"
    assert why(req=SwitchRequest("prefill"), idle=False) == "ok"  # already there: no idle rule
    assert why(idle=False, req=SwitchRequest("decode")) == "instance is not idle; drain all requests before switching"
    assert why(req=SwitchRequest("decode", -1.0)) == "decode_cuda_graph_memory_gb must be non-negative"
    assert why(req=SwitchRequest("decode", 12.5)) == \
        "insufficient decode CUDA graph headroom: required=12.500 GB, available=12.000 GB"
    assert why(state=RoleSwitchState(decode_graphs=True), req=SwitchRequest("decode")) == "ok"


def test_speculative_workers_cannot_enable_it() -> None:
    with pytest.raises(ValueError, match=r"^--enable-pd-role-switch does not rebuild role-specific state for the "
                                         r"following features: speculative decoding \(--speculative-algorithm EAGLE3\)"):
        WorkerSpec("prefill", enable_pd_role_switch=True)


def test_endpoint_bodies_and_a_swapped_pair_serves(fleet: ThreadedSimCluster) -> None:
    c = fleet
    _expect(_switch(c, PLAIN, new_role="decode"), 400, "--enable-pd-role-switch is not set on this server",
            "prefill", "decode", True)
    _expect(_switch(c, MIXED, new_role="decode"), 400, "instance is not running in PD disaggregation mode",
            "null", "decode", True)
    bad = _switch(c, PREFILL, new_role="mixed")
    assert bad.status_code == 400 and bad.json()["type"] == "Bad Request" and "new_role" in bad.json()["message"]
    _expect(_switch(c, PREFILL, new_role="prefill"), 200, "ok", "prefill", "prefill", False)
    # a prefill has no decode CUDA graphs: the caller must say how much memory their capture takes
    _expect(_switch(c, PREFILL, new_role="decode"), 400,
            "decode_cuda_graph_memory_gb is required before capturing decode graphs", "prefill", "decode", True)
    _expect(_switch(c, PREFILL, new_role="decode", decode_cuda_graph_memory_gb=4, prepare_only=True), 200,
            "ready", "prefill", "decode", True)
    assert _modes(c, PREFILL) == ("prefill", "prefill", "prefill")  # prepare_only changes nothing

    # the decode runs a bootstrap server from launch (disagg_service.py), with no prefill registered yet
    route = httpx.get(f"http://127.0.0.1:{c.workers[DECODE].bootstrap_port}/route", timeout=5)
    assert route.status_code == 503 and route.text == "Prefill server not fully registered yet (0 workers registered)."

    _expect(_switch(c, PREFILL, new_role="decode", decode_cuda_graph_memory_gb=4), 200, "ok", "prefill", "decode",
            False)
    _expect(_switch(c, DECODE, new_role="prefill"), 200, "ok", "decode", "prefill", False)
    # ServerArgs keep the launch role; the scheduler and the tokenizer's config view have the live one
    assert _modes(c, PREFILL) == ("prefill", "decode", "decode")
    assert _modes(c, DECODE) == ("decode", "prefill", "prefill")
    assert httpx.get(f"http://127.0.0.1:{c.workers[DECODE].bootstrap_port}/route", timeout=5).status_code == 200
    p, d = _pd(c, prefill=DECODE, decode=PREFILL)
    assert p.status_code == d.status_code == 200, (p.text, d.text)
    assert d.json()["meta_info"]["completion_tokens"] == 4
    metrics = httpx.get(c.urls[PREFILL] + "/metrics", timeout=5).text
    assert 'engine_type="dynamic"' in metrics and 'engine_type="decode"' not in metrics
    # its graphs were captured by the first switch: back and forth needs no memory figure again
    _expect(_switch(c, PREFILL, new_role="prefill"), 200, "ok", "decode", "prefill", False)
    _expect(_switch(c, PREFILL, new_role="decode"), 200, "ok", "prefill", "decode", False)


def test_a_busy_worker_is_refused(fleet: ThreadedSimCluster) -> None:
    c = fleet
    body = {"text": "waits for a decode that never comes", "sampling_params": {"max_new_tokens": 4},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": c.workers[PREFILL].bootstrap_port,
            "bootstrap_room": random.randint(1, 2**62)}
    with cf.ThreadPoolExecutor(1) as ex:
        pending = ex.submit(httpx.post, c.urls[PREFILL] + "/generate", json=body, timeout=20)
        deadline = time.monotonic() + 5
        while c.workers[PREFILL].fully_idle and time.monotonic() < deadline:
            time.sleep(0.01)
        _expect(_switch(c, PREFILL, new_role="decode", decode_cuda_graph_memory_gb=1), 400,
                "instance is not idle; drain all requests before switching", "prefill", "decode", True)
        assert pending.result().status_code == 500  # its bootstrap timeout
    _expect(_switch(c, PREFILL, new_role="decode", decode_cuda_graph_memory_gb=1), 200, "ok", "prefill", "decode",
            False)


def test_a_failed_rebuild_needs_a_restart(fleet: ThreadedSimCluster) -> None:
    c = fleet
    c.workers[DECODE].role_switch.rebuild_fault = "KV manager init failed"
    _expect(_switch(c, DECODE, new_role="prefill"), 400,
            "role switch failed; instance unhealthy, restart required: KV manager init failed", "decode", "prefill",
            False)
    _expect(_switch(c, DECODE, new_role="prefill"), 400,
            "instance is unhealthy after a failed role switch; restart required", "decode", "prefill", False)
    port = c.workers[DECODE].bootstrap_port
    c.stop_worker(DECODE)
    c.start_worker(DECODE)  # a new process: healthy, its launch role, the same bootstrap port
    assert c.workers[DECODE].bootstrap_port == port
    _expect(_switch(c, DECODE, new_role="prefill"), 200, "ok", "decode", "prefill", False)


def test_sim_serve_flag_and_admin_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "serve", "--prefill", "1", "--enable-pd-role-switch"]) == 64
    assert "speculative decoding" in capsys.readouterr().err  # the default preset runs EAGLE3
    c = start_cluster_in_thread([_spec("prefill", admin_api_key="k")])
    try:
        assert _switch(c, 0, new_role="prefill").status_code == 401
        ok = httpx.post(c.urls[0] + "/pd_role_switch", json={"new_role": "prefill"},
                        headers={"Authorization": "bearer k"}, timeout=5)
        assert ok.status_code == 200 and ok.json()["message"] == "ok"
    finally:
        c.stop()
