"""One simulated SGLang worker over HTTP (aiohttp): its sockets, lifecycle and route tables.

Routes follow `sglang/srt/entrypoints/http_server.py` (0.5.23); see docs/simulator.md for what each
returns and where it departs from SGLang. The handlers live in the modules named for their job:
`info_api` (status and control), `native_api` (/generate), `openai_api` (/v1/...completions),
`bootstrap` (a prefill's bootstrap server, a decode's KV fetch), `hicache_api` (the runtime storage
backend); `runner` runs one prompt.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from infer_ctl.errors import InferctlError
from infer_ctl.sim.bootstrap import BootstrapServer, KvReceiver
from infer_ctl.sim.config import WorkerSpec
from infer_ctl.sim.hicache_api import HiCacheApi
from infer_ctl.sim.info_api import InfoApi, server_args
from infer_ctl.sim.kv_faults import KvFaultsApi
from infer_ctl.sim.native_api import NativeApi
from infer_ctl.sim.openai_api import OpenAIApi
from infer_ctl.sim.role_switch_api import RoleSwitchApi
from infer_ctl.sim.rooms import RoomTable
from infer_ctl.sim.runner import RequestRunner
from infer_ctl.sim.spec_api import SpecApi
from infer_ctl.sim.state import WorkerState

#: aiohttp logs every malformed request with a traceback; sglang-router probes each worker with an
#: HTTP/2 preface (gRPC detection) that aiohttp answers with 400, so those logs are noise: keep errors only
#: at CRITICAL on the simulator's own logger (the request still gets its 400).
_HTTP_LOG = logging.getLogger("infer_ctl.sim.http")
_HTTP_LOG.setLevel(logging.CRITICAL)


class SimBindError(InferctlError):
    def __init__(self, host: str, port: int, exc: OSError) -> None:
        super().__init__(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            remedy="pick another port (or 0 for a free one), or stop whatever listens there",
        )


class SimWorker(WorkerState):
    def __init__(self, spec: WorkerSpec, *, port_fallback: bool = False) -> None:
        super().__init__(spec)
        #: when the spec's fixed port is busy, listen on a free one instead of failing
        self.port_fallback = port_fallback
        self.kv = KvReceiver(self)
        runner = RequestRunner(self, self.kv.fetch)
        self.info_api = InfoApi(self, self._server_args)
        self.native_api = NativeApi(self, runner)
        self.openai_api = OpenAIApi(self, runner)
        self.spec_api = SpecApi(self)
        self.kv_faults_api = KvFaultsApi(self)
        self.hicache_api = HiCacheApi(self)
        self.role_switch_api = RoleSwitchApi(self)
        self.bootstrap_server = BootstrapServer(self)
        self._runners: list[web.AppRunner] = []
        #: connections with a request in flight (both apps): stop() aborts them as a killed process would
        self._inflight: set[asyncio.Transport] = set()

    def _server_args(self) -> dict[str, Any]:
        """The ServerArgs /server_info reports; the launch tests' stand-in extends it with what it was given."""
        return server_args(self)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        self.relaunch_role()  # a new process runs its launch flags' role, whatever it was switched to
        self.open_kv_events()
        self.hicache_api.relaunch()  # a new process: the launch flags' storage backend, not a runtime attach
        self.cache.reset()  # with KV events: AllBlocksCleared, seq 0 of the new publisher
        self.rooms = RoomTable()
        self.engine = self.make_engine()
        self.engine.start()
        self.kv.open()
        try:
            self.port = await self._serve(self._app(), self.port)
            # SGLang 0.5.23 (managers/disagg_service.py): with role switching every PD instance runs a
            # bootstrap server from launch, so one flipped to prefill already has it; a flip never rebuilds it
            if self.spec.role == "prefill" or (self.spec.enable_pd_role_switch and self.spec.role != "mixed"):
                self.bootstrap_port = await self._serve(self._bootstrap_app(), self.spec.bootstrap_port or 0)
            else:
                self.bootstrap_port = self.spec.bootstrap_port
        except BaseException:
            self.close_kv_events()  # a worker that never listened must not keep its KV event ports
            raise
        self.start_time = time.time()
        self.ready = True

    async def _serve(self, app: web.Application, port: int) -> int:
        # handler_cancellation: a client that disconnects cancels its request, as SGLang aborts it
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, logger=_HTTP_LOG)
        await runner.setup()
        site = web.TCPSite(runner, self.spec.host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            if not (self.port_fallback and port):
                await runner.cleanup()
                raise SimBindError(self.spec.host, port, exc) from exc
            # the demo's fixed ports are taken (another demo, a real server): any free port will do, and
            # where extra loopback addresses (127.0.0.11) do not exist (macOS), 127.0.0.1 will do
            try:
                site = web.TCPSite(runner, self.spec.host, 0, reuse_address=True)
                await site.start()
            except OSError:
                self.spec.host = "127.0.0.1"
                site = web.TCPSite(runner, self.spec.host, 0, reuse_address=True)
                await site.start()
        self._runners.append(runner)
        server: Any = site._server  # aiohttp exposes the bound port only through the asyncio server
        return int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self.ready = False
        # A killed SGLang process drops every connection at once: abort the sockets of in-flight requests
        # (handler_cancellation then cancels their handlers, including a decode's wait in KvReceiver.fetch,
        # whose claim on the prefill closes with it) instead of answering them or waiting for their timeouts.
        for transport in list(self._inflight):
            transport.abort()
        self._inflight.clear()
        if self.engine:
            await self.engine.stop()
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        await self.kv.close()
        self.close_kv_events()

    # -- apps -------------------------------------------------------------------------------------
    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        transport = request.transport
        if transport is not None:
            self._inflight.add(transport)
        try:
            response: web.StreamResponse = await handler(request)
            return response
        finally:
            if transport is not None:
                self._inflight.discard(transport)

    def _app(self) -> web.Application:
        info, native, openai = self.info_api, self.native_api, self.openai_api
        app = web.Application(client_max_size=512 * 1024**2, middlewares=[self._track])
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, info.health)
        r.add_get("/ready", info.ready)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, info.server_info)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, info.model_info)
        r.add_get("/v1/models", info.models)
        r.add_get("/v1/models/{model:.+}", info.model)  # a model path holds slashes
        r.add_get("/v1/loads", info.loads)
        for path in ("/v1/tokenize", "/tokenize"):
            r.add_post(path, info.tokenize)
        r.add_route("*", "/flush_cache", info.flush_cache)
        r.add_get("/metrics", info.metrics)
        r.add_post("/generate", native.generate)
        r.add_put("/generate", native.generate)
        r.add_post("/v1/completions", openai.completions)
        r.add_post("/v1/chat/completions", openai.chat_completions)
        hc = self.hicache_api  # sim/hicache_api.py
        r.add_get("/hicache/storage-backend", hc.status)
        r.add_put("/hicache/storage-backend", hc.attach)
        r.add_delete("/hicache/storage-backend", hc.detach)
        r.add_post("/hicache/storage-backend/clear", hc.clear)
        r.add_post("/pd_role_switch", self.role_switch_api.switch)
        r.add_get("/sim/spec", self.spec_api.show)
        r.add_post("/sim/spec/alpha", self.spec_api.shift_alpha)
        r.add_get("/sim/kv/faults", self.kv_faults_api.show)
        r.add_post("/sim/kv/faults", self.kv_faults_api.set)
        return app

    def _bootstrap_app(self) -> web.Application:
        b = self.bootstrap_server
        app = web.Application(middlewares=[self._track])
        app.router.add_get("/health", b.health)
        app.router.add_route("*", "/route", b.route)
        app.router.add_post("/register_dp_rank", b.register_dp_rank)
        app.router.add_post("/query_dp_ranks", b.query_dp_ranks)
        app.router.add_post("/sim/kv/{room}", b.claim)
        return app
