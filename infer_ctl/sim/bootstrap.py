"""The PD bootstrap protocol over HTTP, both ends: the server a prefill runs on its bootstrap port, and
the decode's client that finds the prefill, claims a room and waits for the KV to land.

Routes of the server follow SGLang 0.5.23's bootstrap server (`disaggregation/common/conn.py`:
`/health`, `/route`, `/register_dp_rank`, `/query_dp_ranks`); `POST /sim/kv/{room}` stands in for the
KV transfer engine (the decode's claim, answered once the prefill "transferred"; see `rooms.py`).
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from infer_ctl.sim.config import DEFAULT_BOOTSTRAP_PORT, FAKE_BOOTSTRAP_HOST
from infer_ctl.sim.protocol import GenItem, RequestError
from infer_ctl.sim.rooms import RoomError, prompt_digest
from infer_ctl.sim.state import WorkerState


class BootstrapServer:
    """The prefill side: handlers of the bootstrap HTTP server (routed in `server.py`)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def register_dp_rank(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def query_dp_ranks(self, request: web.Request) -> web.Response:
        return web.json_response({"dp_ranks": [0]})

    async def route(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            return web.Response(text="OK")
        if not self.state.bootstrap_registered:  # a role-switch decode's bootstrap server: no prefill yet
            return web.Response(text="Prefill server not fully registered yet (0 workers registered).", status=503)
        return web.json_response(
            {
                "prefill_attn_tp_size": 1,
                "prefill_dp_size": 1,
                "prefill_pp_size": 1,
                "prefill_page_size": 1,
                "rank_ip": self.state.spec.host,
                "rank_port": self.state.bootstrap_port,
            }
        )

    async def claim(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
            body = await request.json()
            timeout = float(body.get("timeout", self.state.spec.waiting_timeout_s))
            transport = request.transport
            result = await self.state.rooms.claim(
                room,
                str(body.get("digest")),
                timeout,
                decode_alive=lambda: transport is not None and not transport.is_closing(),
                decode=str(body["decode"]) if body.get("decode") else None,
            )
        except RoomError as exc:
            return web.json_response({"error": exc.message}, status=exc.status)
        except (ValueError, TypeError) as exc:
            return web.json_response({"error": f"bad claim: {exc}"}, status=400)
        return web.json_response(result)


class KvReceiver:
    """The decode side: one HTTP client session per worker start (`open` / `close`)."""

    def __init__(self, state: WorkerState) -> None:
        self.state = state
        self._client: aiohttp.ClientSession | None = None

    def open(self) -> None:
        self._client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        if self._client:
            await self._client.close()
            self._client = None

    async def fetch(self, item: GenItem) -> int:
        """Find the prefill's bootstrap server, claim the room, wait for the KV to land; returns the
        prefill's cached_tokens. Raises RequestError (500) on every PD failure."""
        spec, pd = self.state.spec, item.pd
        timeout = spec.waiting_timeout_s
        assert pd.room is not None
        if pd.host == FAKE_BOOTSTRAP_HOST:  # SGLang's FakeKVReceiver: decode without any KV transfer
            return 0
        if pd.room == 0:  # SGLang's decode never sees room 0's metadata land: it stalls to the timeout
            await asyncio.sleep(timeout)
            raise RequestError(
                500,
                f"KV transfer failed for bootstrap_room=0: timed out after {timeout:g}s "
                "waiting for KV (room 0 is never valid; draw rooms from [1, 2**63))",
            )
        host = pd.host or "127.0.0.1"
        port = pd.port if pd.port is not None else (spec.bootstrap_port or DEFAULT_BOOTSTRAP_PORT)
        base = f"http://{host}:{port}"
        assert self._client is not None
        try:
            async with self._client.get(
                f"{base}/route",
                params={"engine_rank": "-1", "target_dp_group": "-1"},
                timeout=aiohttp.ClientTimeout(total=5),
            ) as r:
                if r.status != 200:
                    raise RequestError(
                        500, f"KV transfer failed: prefill bootstrap server {base} answered {r.status}"
                    )
            async with self._client.post(
                f"{base}/sim/kv/{pd.room}",
                json={"digest": prompt_digest(item.input_ids), "timeout": timeout, "decode": self.state.url},
                timeout=aiohttp.ClientTimeout(total=timeout + 5),
            ) as r:
                body = await r.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.state.running_engine().metrics.transfer_failed += 1
            raise RequestError(
                500,
                f"KV transfer failed for bootstrap_room={pd.room}: cannot reach the "
                f"prefill bootstrap server {base} ({type(exc).__name__}: {exc})",
            ) from None
        if r.status != 200:
            why = str(body.get("error") or f"bootstrap server answered {r.status}")
            if not why.startswith("KV transfer failed"):
                why = f"KV transfer failed for bootstrap_room={pd.room}: {why}"
            raise RequestError(500, why)
        return int(body["cached_tokens"])
