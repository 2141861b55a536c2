"""The operator API under /admin (bearer token from an environment variable; see config.validate for the
rule that refuses a non-loopback listener without one): its routes, each guarded by the token. The
handlers are by subject: admin_status.py (status and the controllers' reports), admin_workers.py
(workers and pairs), admin_prefixes.py (named prefixes)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from infer_ctl.router.control.admin_http import authorized
from infer_ctl.router.control.admin_prefixes import PrefixRoutes
from infer_ctl.router.control.admin_status import StatusRoutes
from infer_ctl.router.control.admin_workers import WorkerRoutes
from infer_ctl.router.http.jsonio import error_body
from infer_ctl.router.request.proxy import Router


class Admin:
    def __init__(self, router: Router, *, status: StatusRoutes, workers: WorkerRoutes, prefixes: PrefixRoutes,
                 on_change: Callable[[], None] | None = None) -> None:
        self.router = router
        self.status = status
        self.workers = workers
        self.prefixes = prefixes
        #: the leader of several router processes: write the snapshot (follow.py) before a change is
        #: answered, so a change the client saw acknowledged survives the leader's death right after
        self.on_change = on_change

    def routes(self, app: web.Application) -> None:
        # Auth wraps the admin handlers only: a middleware would run on every data-plane request too.
        r = app.router
        g = self._guarded
        s, w, p = self.status, self.workers, self.prefixes
        r.add_get("/admin/status", g(s.status))
        r.add_get("/admin/workers", g(w.workers))
        r.add_post("/admin/workers", g(w.add_worker))
        r.add_post("/admin/workers/remove", g(w.remove_worker))
        r.add_post("/admin/workers/drain", g(w.drain_worker))
        r.add_get("/admin/spec", g(s.spec))
        r.add_get("/admin/tenants", g(s.tenants))
        r.add_post("/admin/spec/actions", g(s.spec_action))
        r.add_get("/admin/pd", g(s.pd))
        r.add_post("/admin/pd/actions", g(s.pd_action))
        r.add_get("/admin/pairs", g(w.pairs))
        r.add_post("/admin/pairs", g(w.push_pair))
        r.add_get("/admin/prefixes", g(p.prefixes))
        r.add_post("/admin/prefixes", g(p.add_prefix))
        r.add_post("/admin/prefixes/{name}/expire", g(p.expire_prefix))
        r.add_post("/admin/prefixes/{name}/warm", g(p.warm_prefix))
        r.add_post("/admin/prefixes/{name}/remove", g(p.remove_prefix))

    def _guarded(self, handler: Any) -> Any:
        async def guarded(request: web.Request) -> web.StreamResponse:
            token = self.router.cfg.admin_token
            if token and not authorized(token, request.headers.get("Authorization", "")):
                return web.Response(
                    status=401, content_type="application/json",
                    body=error_body(401, f"missing or wrong bearer token; send Authorization: Bearer "
                                    f"${self.router.cfg.settings.admin_token_env}"),
                    headers={"WWW-Authenticate": "Bearer"})
            resp = await handler(request)
            if self.on_change is not None and request.method != "GET":
                self.on_change()
            return resp

        return guarded
