"""`POST /pd_role_switch` (SGLang 0.5.23 `entrypoints/http_server.py`): the answer `role_switch.decide`
gives, and the switch itself: the old role's engine torn down, the prefix cache released, the new role's
engine built on the same KV pool (`disaggregation/role_switch.py`: the pool is role-independent and kept;
the disaggregation structures and the radix tree are not)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from infer_ctl.core.sizing import presets as hw
from infer_ctl.sim import contract
from infer_ctl.sim.hicache_api import _bearer_ok
from infer_ctl.sim.role_switch import Outcome, decide, parse_request, rebuild_failed
from infer_ctl.sim.timing import preset

if TYPE_CHECKING:
    from infer_ctl.sim.state import WorkerState


def graph_headroom_gb(state: WorkerState) -> float:
    """GPU memory outside --mem-fraction-static on one GPU: where decode CUDA graphs are captured
    (SGLang asks `get_available_gpu_memory`; the simulator has no allocator, so it is the whole rest)."""
    p = preset(state.spec.preset)
    accel = hw.accelerator_preset(p.prefill_accelerator if state.spec.role == "prefill" else p.decode_accelerator)
    return accel.hbm_gb * (1 - p.mem_fraction)


class RoleSwitchApi:
    def __init__(self, state: WorkerState) -> None:
        self.state = state

    def _refused(self, request: web.Request) -> web.Response | None:
        # AuthLevel.ADMIN_OPTIONAL: open without an admin key, the key's bearer token with one
        key = self.state.spec.admin_api_key
        if key is not None and not _bearer_ok(request.headers.get("Authorization"), key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return None

    async def switch(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused:
            return refused
        try:
            body: Any = await request.json()
        except ValueError as exc:
            return _bad_request(contract.json_error(exc))
        req = parse_request(body)
        if isinstance(req, list):
            return _bad_request(contract.validation_text(req))
        st = self.state
        outcome = decide(enabled=st.spec.enable_pd_role_switch, mode=st.mode, idle=st.fully_idle,
                         state=st.role_switch, req=req, graph_headroom_gb=graph_headroom_gb(st))
        if outcome.switch:
            outcome = await self._flip(outcome)
        return web.json_response(outcome.body(), status=outcome.status)

    async def _flip(self, outcome: Outcome) -> Outcome:
        st, rs = self.state, self.state.role_switch
        rs.in_progress = True
        try:
            if rs.rebuild_fault is not None:  # teardown done, rebuild raised: no rollback (role_switch.py)
                rs.unhealthy = True
                return rebuild_failed(outcome, rs.rebuild_fault)
            old = st.running_engine()
            await old.stop()
            st.cache.reset()  # _release_prefix_cache_for_role_switch: stale prefixes must not match
            st.role = outcome.new_role
            new = st.make_engine()
            new.metrics = old.metrics  # one metric series across flips (engine_type "dynamic")
            new.start()
            st.engine = new
            if outcome.new_role == "decode":
                rs.decode_graphs = True  # captured now, reused by every later switch to decode
            else:
                st.bootstrap_registered += 1  # the new prefill's KV manager registers with its bootstrap server
            rs.switches += 1
            return outcome
        finally:
            rs.in_progress = False


def _bad_request(message: str) -> web.Response:
    """SGLang's RequestValidationError handler: FastAPI's 422 rendered as 400 ErrorResponse."""
    return web.json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                              "code": 400}, status=400)
