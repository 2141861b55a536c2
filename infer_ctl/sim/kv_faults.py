"""Fault injection for one prefill's KV transfers to one decode (tests, demos of the router's pair health):
`POST /sim/kv/faults` on a prefill's HTTP port with `{"decode": URL, "slowdown": 10}` (transfers to that
decode take 10x longer: lower kv_transfer_speed_gb_s, higher kv_transfer_latency_ms), `{"decode": URL,
"fail": true}` (every transfer to it fails, as a broken RDMA path does), or `{"decode": URL}` to clear;
`GET` shows them. Not an SGLang API (it has none); the decode names itself in the simulator's claim.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from infer_ctl.sim.state import WorkerState


class KvFaultsApi:
    def __init__(self, state: WorkerState) -> None:
        self.state = state

    async def show(self, request: web.Request) -> web.Response:
        return web.json_response({"faults": self.state.kv_faults})

    async def set(self, request: web.Request) -> web.Response:
        try:
            body: Any = await request.json()
        except ValueError:
            return web.json_response({"error": "malformed JSON body"}, status=400)
        decode = str(body.get("decode") or "").rstrip("/") if isinstance(body, dict) else ""
        slowdown, fail = (body.get("slowdown"), body.get("fail")) if isinstance(body, dict) else (None, None)
        if not decode or (slowdown is not None and (not isinstance(slowdown, int | float) or slowdown < 1)) \
                or (fail is not None and not isinstance(fail, bool)):
            return web.json_response({"error": "give decode (its URL), slowdown >= 1 and/or fail: true|false"},
                                     status=400)
        if slowdown is None and not fail:
            self.state.kv_faults.pop(decode, None)
        else:
            self.state.kv_faults[decode] = {"slowdown": float(slowdown or 1.0), "fail": bool(fail)}
        return web.json_response({"faults": self.state.kv_faults})
