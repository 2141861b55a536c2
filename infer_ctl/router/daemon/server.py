"""The HTTP front of the router: endpoints, limits, lifecycle (start, drain, stop).

Stack (docs/router.md, "HTTP stack", records the measurements): the data plane - the generate
endpoints, /health, /metrics, /v1/models, /model_info, /server_info, /flush_cache - is served by the
router's own HTTP/1.1 protocol on httptools (h1.py) on uvloop, with the router's own keep-alive upstream
client (upstream.py). The operator API (/admin/..., admin.py) stays an aiohttp application: it is served
on a private unix socket, and the front relays /admin/ requests to it unchanged (headers, body, status),
so its auth and handlers are aiohttp's and its cost never touches the data plane. A client that
disconnects cancels its request's task, which closes the upstream connections, which makes SGLang abort
the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from typing import Any

from aiohttp import web

from infer_ctl.errors import UsageError
from infer_ctl.router.config import RouterConfig
from infer_ctl.router.control.admin import Admin
from infer_ctl.router.control.admin_http import authorized
from infer_ctl.router.control.health import HealthChecker
from infer_ctl.router.control.warmer import PrefixWarmer
from infer_ctl.router.daemon.admin_dir import make_admin_dir
from infer_ctl.router.daemon.nofile import default_max_connections, raise_nofile, refusing_budget
from infer_ctl.router.daemon.server_info import pd_server_info
from infer_ctl.router.fleet.shared_load import SharedLoad
from infer_ctl.router.http.h1 import H1Server, Request, Response, StreamResponse
from infer_ctl.router.http.jsonio import JSON_TYPE, dumps, error_body
from infer_ctl.router.http.upstream import Pool, UpstreamError
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout.follow import Follower, ProcessRole, Publisher
from infer_ctl.router.scaleout.metrics_merge import ProcessMetrics
from infer_ctl.router.scaleout.state_sync import StateSync

log = logging.getLogger("infer_ctl.router")

GENERATE_ENDPOINTS = ("/generate", "/v1/completions", "/v1/chat/completions")
#: response headers of the admin app that are not relayed (the front frames its own response)
_HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server",
                          "content-type"})


#: how long a worker may wait for its scheduler to be idle before flushing (SGLang's `?timeout=`)
_FLUSH_WAIT_S = 20.0


class RouterServer:
    def __init__(self, cfg: RouterConfig, *, router: Router, health: HealthChecker, warmer: PrefixWarmer,
                 admin: Admin, replicas: StateSync | None = None, role: ProcessRole | None = None,
                 procs: Publisher | Follower | None = None, shared: SharedLoad | None = None,
                 process_metrics: ProcessMetrics | None = None) -> None:
        """Built by router/daemon/assembly.py `build`. `role`: one of several router processes
        (router/daemon/procs.py; follow.py says who does what), `procs` its side of the leader's snapshot
        and `shared` the supervisor's shared block; `replicas`: the state store shared with other router
        replicas (router/scaleout/state_sync.py)."""
        self.cfg = cfg
        self.proc = role
        self.shared = shared
        self.procs = procs
        self.replicas = replicas
        self.process_metrics = process_metrics
        self.router = router
        self.health = health
        self.warmer = warmer
        self.admin = admin
        self.http = H1Server(self.dispatch, cfg.settings.max_body_bytes)
        self.runner: web.AppRunner | None = None
        self._admin_dir: str | None = None
        self._admin_lock: int | None = None
        self._admin_pool: Pool | None = None
        self.port = cfg.port
        self._generate = set(GENERATE_ENDPOINTS)
        self._gets: dict[str, Any] = {"/health": self.health_endpoint, "/health_generate": self.health_endpoint,
                                      "/ready": self.health_endpoint, "/metrics": self.metrics}
        for path in ("/v1/models", "/model_info"):
            self._gets[path] = self.proxy_get(path)
        self._proxy_server_info = self.proxy_get("/server_info")
        self._gets["/server_info"] = self.server_info
        # SGLang's deprecated aliases, still served by 0.5.23 workers and used by SGLang's own frontend
        self._gets["/get_server_info"] = self._gets["/server_info"]
        self._gets["/get_model_info"] = self._gets["/model_info"]

    @property
    def url(self) -> str:
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        return f"http://{host}:{self.port}"

    def admin_app(self) -> web.Application:
        app = web.Application(client_max_size=self.cfg.settings.max_body_bytes)
        self.admin.routes(app)
        return app

    # ---- dispatch --------------------------------------------------------------------------------
    async def dispatch(self, request: Request) -> Response | StreamResponse:
        path, method = request.path, request.method
        if path in self._generate:
            if method != "POST":
                return _error(405, f"{path} takes POST")
            return await self.router.handle(request, path)
        handler = self._gets.get(path)
        if handler is not None:
            if method not in ("GET", "HEAD"):
                return _error(405, f"{path} takes GET")
            resp: Response = await handler(request)
            return resp
        if path.startswith("/v1/models/"):  # SGLang 0.5.23's model card (404 for another model): the worker's answer
            if method not in ("GET", "HEAD"):
                return _error(405, f"{path} takes GET")
            model_card: Response = await self.proxy_get(path)(request)
            return model_card
        if path == "/flush_cache":
            # Destructive for every worker's cache: behind the admin token, like SGLang's own admin key.
            if not authorized(self.cfg.admin_token, request.headers.get("authorization", "")):
                resp = _error(401, "missing or wrong bearer token; send Authorization: Bearer "
                                   f"${self.cfg.settings.admin_token_env}")
                resp.headers = {"WWW-Authenticate": "Bearer"}
                return resp
            return await self.flush_cache(request)
        if path.startswith("/admin/") or path == "/admin":
            return await self.relay_admin(request)
        return _error(404, f"no endpoint {path}; see docs/router.md for the router's endpoints")

    async def relay_admin(self, request: Request) -> Response:
        if request.too_large:
            return _error(413, f"request body over {self.cfg.settings.max_body_bytes} bytes")
        assert self._admin_pool is not None
        headers = {k: v for k, v in request.headers.items()
                   if k in ("authorization", "content-type", "x-request-id", "accept")}
        target = request.path + ("?" + request.query if request.query else "")
        try:
            resp = await asyncio.wait_for(self._admin_pool.request(request.method, target, request.body, headers), 60)
            data = await resp.read()
        except (UpstreamError, TimeoutError) as exc:
            if self.proc is not None and not self.proc.leader and isinstance(exc, UpstreamError):
                # the leader process is being restarted (its socket is gone or refuses): not an error of
                # the admin API, and over in a second or two
                busy = _error(503, "the router's leader process is restarting; retry in a few seconds")
                busy.headers = {"Retry-After": "2"}
                return busy
            return _error(500, f"admin API failed: {exc}; see the router's log")
        extra = {k: v for k, v in resp.headers.items() if k not in _HOP_HEADERS}
        return Response(resp.status, data, resp.headers.get("content-type", JSON_TYPE), extra or None)

    # ---- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        proc = self.proc
        if proc is None:
            self._admin_dir, self._admin_lock = make_admin_dir()  # (dead routers' ones swept first)
            sock = os.path.join(self._admin_dir, "admin.sock")
        else:  # the supervisor's private directory; only the leader serves the admin API there
            sock = proc.admin_sock
            self._take_state()
        if proc is None or proc.leader:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(sock)  # a leader that died left its socket behind
            self.runner = web.AppRunner(self.admin_app(), access_log=None, handler_cancellation=True)
            await self.runner.setup()
            await web.UnixSite(self.runner, sock).start()
        self._admin_pool = Pool("localhost", 0, unix=sock, max_idle=4)
        soft, _ = raise_nofile()  # systemd's soft 1,024 would cap the router near 1,000 clients
        self.http.max_connections = (self.cfg.settings.max_connections
                                     or default_max_connections(soft, self.cfg.settings.max_concurrent))
        self.http.max_refusing = refusing_budget(soft)
        try:
            self.port = await self.http.listen(self.cfg.host, self.cfg.port, reuse_port=proc is not None)
        except OSError as exc:  # includes socket.gaierror (unresolvable host)
            if self.runner is not None:
                await self.runner.cleanup()
            if self._admin_dir is not None:
                shutil.rmtree(self._admin_dir, ignore_errors=True)
            if self._admin_lock is not None:
                os.close(self._admin_lock)
                self._admin_lock = None
            raise UsageError(f"cannot listen on {self.cfg.host}:{self.cfg.port}: {exc.strerror or exc}",
                             remedy="stop the process using that address or pick another --listen (or the "
                             "profile's router.listen)") from None
        self.router.kv.start()
        if self.replicas is not None:  # several replicas: the fleet's named prefixes and worker changes
            await self.replicas.start()
        await self.health.check_all()
        self.health.start()
        if proc is None or proc.leader:
            self.warmer.start()
        if self.procs is not None:
            self.procs.start()
        if self.process_metrics is not None:
            self.process_metrics.start()
        extra = {} if proc is None else {"router_process": proc.index, "processes": proc.processes}
        if proc is not None:
            proc.ready_file(proc.index).touch()  # the supervisor logs once every process listens
        log.info("router listening", extra={"url": self.url, "mode": self.router.mode,
                                            "workers": len(self.router.workers.all()), "policy": self.cfg.settings.policy,
                                            "max_connections": self.http.max_connections, **extra})

    def _take_state(self) -> None:
        """One of several processes, before the first request: take the leader's state (the leader: its
        own last snapshot, after a restart)."""
        if isinstance(self.procs, Publisher):
            self.procs.adopt()
            self.procs.publish()  # the supervisor starts the followers once this file exists
        elif self.procs is not None:
            self.procs.poll()

    async def stop(self, drain: bool = True) -> None:
        """Refuse new requests (503), let in-flight ones finish (up to drain_timeout_s), then close."""
        router = self.router
        router.draining = True
        if drain:
            deadline = time.monotonic() + self.cfg.settings.drain_timeout_s
            lingering = router.attempts.lingering  # prefill answers still arriving after the client's
            while (router.active or lingering) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            if router.active or lingering:
                log.warning("drain timed out; closing with requests in flight",
                            extra={"active": router.active, "prefill_answers": len(lingering)})
        if self.replicas is not None:
            await self.replicas.stop()
        await self.health.stop()
        await self.warmer.stop()
        if self.procs is not None:
            await self.procs.stop()
        if self.process_metrics is not None:
            await self.process_metrics.stop()
        await router.kv.stop()
        router.coalesce.close()
        router.cancel_background()
        await self.http.close_all()
        if self._admin_pool is not None:
            self._admin_pool.close()
        if self.runner is not None:
            await self.runner.cleanup()
        if self._admin_dir is not None:
            shutil.rmtree(self._admin_dir, ignore_errors=True)
        if self._admin_lock is not None:
            os.close(self._admin_lock)
            self._admin_lock = None
        router.upstreams.close()
        if router.observing is not None:
            await router.observing.close()  # the spans still queued go to the collector
        if self.shared is not None:
            for w in router.workers.all():
                w.shared = None  # nothing writes into the block once it is closed
            self.shared.close()
        log.info("router stopped")

    # ---- endpoints -------------------------------------------------------------------------------
    async def health_endpoint(self, request: Request) -> Response:
        router = self.router
        now = router.clock()
        if router.mode == "pd":
            need = {"prefill": any(w.available(now) for w in router.workers.role("prefill")),
                    "decode": any(w.available(now) for w in router.workers.role("decode"))}
        else:
            need = {"worker": any(w.available(now) for w in router.workers.role("mixed"))}
        ok = all(need.values()) and not router.draining
        doc: dict[str, Any] = {"status": "ok" if ok else "unavailable", "draining": router.draining,
                               "available": need}
        if self.proc is not None:  # which of the router's processes answered (the kernel picks one per connection)
            doc["process"] = {"index": self.proc.index, "pid": os.getpid(), "processes": self.proc.processes,
                              "state_version": self.procs.version if self.procs is not None else 0}
        return Response(200 if ok else 503, dumps(doc))

    def proxy_get(self, path: str) -> Any:
        async def handler(request: Request) -> Response:
            router = self.router
            now = router.clock()
            for w in sorted(router.workers.prefill_like(), key=lambda w: not w.available(now)):
                try:
                    status, data = await asyncio.wait_for(router.upstreams.fetch(w.url, "GET", path), 10)
                except (UpstreamError, TimeoutError):
                    continue
                return Response(status, data)
            if path == "/v1/models" and self.cfg.model_name:
                return Response(200, dumps({"object": "list", "data": [
                    {"id": self.cfg.model_name, "object": "model", "owned_by": "sglang"}]}))
            return _error(503, "no worker answered; check `inferctl router workers`")

        return handler

    async def server_info(self, request: Request) -> Response:
        """Collocated: one worker's answer. PD: also every prefill's and decode's (server_info.py)."""
        if self.router.mode == "pd":
            doc = await pd_server_info(self.router)
            if doc is not None:
                return Response(200, dumps(doc))
        resp: Response = await self._proxy_server_info(request)
        return resp

    async def metrics(self, request: Request) -> Response:
        # several processes: every one answers for all of them (metrics_merge.py)
        data = self.process_metrics.scrape() if self.process_metrics is not None else self.router.metrics.render()
        return Response(200, data, "text/plain; version=0.0.4; charset=utf-8")

    async def flush_cache(self, request: Request) -> Response:
        """Fan out to every worker; on success, the worker's predicted cache is empty too."""
        router = self.router
        results: dict[str, Any] = {}

        async def one(w: Any) -> None:
            try:
                # SGLang flushes only an idle scheduler and answers 400 at once otherwise; a PD prefill is
                # briefly busy with each /health probe (a one-token prefill). `timeout` (0.5.23) makes it
                # wait for idle instead, up to that many seconds.
                status, data = await asyncio.wait_for(
                    router.upstreams.fetch(w.url, "POST", f"/flush_cache?timeout={_FLUSH_WAIT_S:g}"), _FLUSH_WAIT_S + 5)
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
        return Response(200 if ok else 502, dumps({"ok": ok, "workers": results}))


def _error(status: int, message: str) -> Response:
    return Response(status, error_body(status, message))
