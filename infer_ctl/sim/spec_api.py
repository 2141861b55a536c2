"""The simulator's own speculative-decoding admin API (not SGLang's): read the acceptance model, shift a
domain's alpha at run time (drift on demand: the demo and the controller's tests use it).

GET  /sim/spec                                -> live step count, adaptive slots, each domain's alpha
POST /sim/spec/alpha {"domain": D, "alpha": A} -> from now on D accepts with A (400 on bad input)
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from infer_ctl.sim.protocol import RequestError
from infer_ctl.sim.state import WorkerState
from infer_ctl.sim.wire import read_json


class SpecApi:
    def __init__(self, state: WorkerState) -> None:
        self.state = state

    def _off(self) -> web.Response | None:
        if self.state.running_engine().spec is None:
            return web.json_response({"error": "speculative decoding is off on this worker"}, status=400)
        return None

    async def show(self, request: web.Request) -> web.Response:
        if (off := self._off()) is not None:
            return off
        spec = self.state.running_engine().spec
        assert spec is not None
        return web.json_response(spec.snapshot())

    async def shift_alpha(self, request: web.Request) -> web.Response:
        if (off := self._off()) is not None:
            return off
        spec = self.state.running_engine().spec
        assert spec is not None
        try:
            body: Any = await read_json(request)
        except RequestError as exc:
            return web.json_response({"error": exc.message}, status=400)
        domain = body.get("domain") if isinstance(body, dict) else None
        alpha = body.get("alpha") if isinstance(body, dict) else None
        if not isinstance(domain, str) or not domain.strip():
            return web.json_response({"error": 'expected {"domain": NAME, "alpha": 0..1}'}, status=400)
        try:
            spec.workload.shift(domain, alpha)  # type: ignore[arg-type]  # checked there
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(spec.snapshot())
