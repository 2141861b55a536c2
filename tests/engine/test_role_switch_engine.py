"""SGLang 0.5.23's runtime role switch (`--enable-pd-role-switch`, `POST /pd_role_switch`) on the real
engine, and the simulator's answers to the same requests (infer_ctl/sim/role_switch*.py), compared field
by field. Only what changes nothing is sent to the shared prefill (refusals, `prepare_only`), so the
other tests keep a plain prefill.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.engine.conftest import Fleet

#: per-process fields: which HTTP worker answered, the request id
VOLATILE = {"rid", "http_worker_ipc"}


@pytest.fixture(scope="module")
def sim_prefill() -> Iterator[str]:
    cluster: ThreadedSimCluster = start_cluster_in_thread(
        [WorkerSpec("prefill", enable_pd_role_switch=True, speculative=False)])
    yield cluster.workers[0].url
    cluster.stop()


def _stable(doc: Any) -> Any:
    return {k: v for k, v in doc.items() if k not in VOLATILE} if isinstance(doc, dict) else doc


@pytest.mark.parametrize("body", [
    {"new_role": "decode"},  # no decode_cuda_graph_memory_gb: refused before anything is touched
    {"new_role": "decode", "decode_cuda_graph_memory_gb": 0.0, "prepare_only": True},  # the preflight: "ready"
    {"new_role": "prefill"},  # the role it has
    {"new_role": "encode"},  # not a PD role
])
def test_role_switch_answers_match_the_engine(engine_fleet: Fleet, sim_prefill: str, body: dict[str, Any]) -> None:
    real = httpx.post(engine_fleet.prefill.url + "/pd_role_switch", json=body, timeout=60)
    sim = httpx.post(sim_prefill + "/pd_role_switch", json=body, timeout=60)
    assert sim.status_code == real.status_code, (body, real.text, sim.text)
    if body["new_role"] not in ("prefill", "decode"):
        # FastAPI's union validation (the dataclass, then a dict) lists 2 errors on the engine, the simulator
        # 1: the same 400, type and the same sentence about the allowed roles (docs/simulator.md)
        for doc in (real.json(), sim.json()):
            assert doc["type"] == "Bad Request" and "Input should be 'prefill', 'decode' or ''" in doc["message"]
        return
    assert _stable(sim.json()) == _stable(real.json()), (body, real.text, sim.text)
    # nothing changed on the engine: still a prefill
    info = httpx.get(engine_fleet.prefill.url + "/server_info", timeout=10).json()
    assert info["internal_states"][0]["disaggregation_mode"] == "prefill"
