"""The HTTP front of the router: endpoints, limits, lifecycle (start, drain, stop).

Stack: aiohttp's server (C HTTP parser, streaming with write back-pressure) on uvloop, with the
router's own keep-alive upstream client (upstream.py). docs/router.md records the measurements behind
this choice. Handler cancellation is on: a client that disconnects cancels its handler, which closes
the upstream connections, which makes SGLang abort the request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web

from infer_ctl.router.admin import Admin
from infer_ctl.router.config import RouterConfig
from infer_ctl.router.health import HealthChecker
from infer_ctl.router.jsonio import dumps, error_body
from infer_ctl.router.proxy import Router
from infer_ctl.router.upstream import UpstreamError
from infer_ctl.router.warmer import PrefixWarmer

log = logging.getLogger("infer_ctl.router")

GENERATE_ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")


class RouterServer:
    def __init__(self, cfg: RouterConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.router = Router(cfg)
        self.health = HealthChecker(self.router)
        self.warmer = PrefixWarmer(self.router)
        self.admin = Admin(self.router, self.warmer, self.health)
        self.runner: web.AppRunner | None = None
        self.port = cfg.port
        self.started_at = time.time()

    @property
    def url(self) -> str:
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"http://{host}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.max_body_bytes)
        r = app.router
        for ep in GENERATE_ENDPOINTS:
            r.add_post(ep, self._generate_handler(ep))
        r.add_get("/health", self.health_endpoint)
        r.add_get("/health_generate", self.health_endpoint)
        r.add_get("/v1/models", self.proxy_get("/v1/models"))
        r.add_get("/model_info", self.proxy_get("/model_info"))
        r.add_get("/server_info", self.proxy_get("/server_info"))
        r.add_get("/metrics", self.metrics)
        r.add_route("*", "/flush_cache", self.flush_cache)
        self.admin.routes(app)
        return app

    def _generate_handler(self, endpoint: str) -> Any:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.router.handle(request, endpoint)

        return handler

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True,
                                    shutdown_timeout=self.cfg.drain_timeout_s)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.cfg.host, self.cfg.port, backlog=1024, reuse_address=True)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]
        await self.health.check_all()
        self.health.start()
        self.warmer.start()
        log.info("router listening", extra={"url": self.url, "mode": self.router.mode,
                                            "workers": len(self.router.workers.all()), "policy": self.cfg.policy})

    async def stop(self, drain: bool = True) -> None:
        """Refuse new requests (503), let in-flight ones finish (up to drain_timeout_s), then close."""
        router = self.router
        router.draining = True
        if drain:
            deadline = time.monotonic() + self.cfg.drain_timeout_s
            while router.active and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if router.active:
                log.warning("drain timed out; closing with requests in flight", extra={"active": router.active})
        await self.health.stop()
        await self.warmer.stop()
        for task in list(router._background):
            task.cancel()
        if self.runner is not None:
            await self.runner.cleanup()
        router.upstreams.close()
        log.info("router stopped")

    # ---- endpoints -------------------------------------------------------------------------------
    async def health_endpoint(self, request: web.Request) -> web.Response:
        router = self.router
        now = router.clock()
        if router.mode == "pd":
            need = {"prefill": any(w.available(now) for w in router.workers.role("prefill")),
                    "decode": any(w.available(now) for w in router.workers.role("decode"))}
        else:
            need = {"worker": any(w.available(now) for w in router.workers.role("mixed"))}
        ok = all(need.values()) and not router.draining
        doc = {"status": "ok" if ok else "unavailable", "draining": router.draining, "available": need}
        return web.Response(status=200 if ok else 503, body=dumps(doc), content_type="application/json")

    def proxy_get(self, path: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            router = self.router
            now = router.clock()
            for w in sorted(router.workers.prefill_like(), key=lambda w: not w.available(now)):
                try:
                    status, data = await asyncio.wait_for(router.upstreams.fetch(w.url, "GET", path), 10)
                except (UpstreamError, TimeoutError):
                    continue
                return web.Response(status=status, body=data, content_type="application/json")
            if path == "/v1/models" and self.cfg.model_name:
                return web.Response(body=dumps({"object": "list", "data": [
                    {"id": self.cfg.model_name, "object": "model", "owned_by": "sglang"}]}), content_type="application/json")
            return web.Response(status=503, body=error_body(503, "no worker answered; check `inferctl router workers`",
                                                            "unavailable"), content_type="application/json")

        return handler

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.router.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Fan out to every worker; on success, the worker's predicted cache is empty too."""
        router = self.router
        results: dict[str, Any] = {}

        async def one(w: Any) -> None:
            try:
                status, data = await asyncio.wait_for(router.upstreams.fetch(w.url, "POST", "/flush_cache"), 30)
            except (UpstreamError, TimeoutError) as exc:
                results[w.url] = {"ok": False, "error": str(exc) or type(exc).__name__}
                return
            results[w.url] = {"ok": status == 200, "status": status, "body": data.decode(errors="replace")[:200]}
            if status == 200:
                router.index.drop_worker(w.url)
                router.prefixes.drop_worker(w.url)

        await asyncio.gather(*(one(w) for w in router.workers.all()))
        self.warmer.poke()
        ok = all(r["ok"] for r in results.values())
        return web.Response(status=200 if ok else 502, body=dumps({"ok": ok, "workers": results}),
                            content_type="application/json")
