"""The operator API's workers and pairs (/admin/workers, /admin/pairs): add, remove, drain; and applying a
worker change, this replica's or (with a state store, router/scaleout/state_sync.py) another's."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from infer_ctl.errors import UsageError
from infer_ctl.router.config import WorkerSpec, parse_prefill, worker
from infer_ctl.router.control.admin_http import (
    error_response,
    is_integer,
    is_number,
    json_body,
    json_response,
    norm_url,
)
from infer_ctl.router.control.health import HealthChecker
from infer_ctl.router.control.warmer import PrefixWarmer
from infer_ctl.router.kvindex.kv_routing import worker_doc
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout.follow import forget_worker
from infer_ctl.router.scaleout.state_sync import StateSync
from infer_ctl.router.scaleout.store_status import StoreUnavailable

log = logging.getLogger("infer_ctl.router")


class WorkerChanges:
    """A worker added, removed or (un)drained on this router: by the admin API, or from the state store."""

    def __init__(self, router: Router, health: HealthChecker, warmer: PrefixWarmer) -> None:
        self.router = router
        self.health = health
        self.warmer = warmer

    def forget(self, url: str) -> None:
        forget_worker(self.router, url)
        self.warmer.poke()

    async def apply(self, url: str, record: dict[str, Any]) -> None:
        """A worker change from the state store (this replica's or another's): add, remove, (un)drain."""
        router = self.router
        w = router.workers.by_url.get(url)
        if not record.get("present"):
            if w is not None:
                self.forget(url)
                log.warning("worker removed (shared change)", extra={"worker": url})
            return
        if w is None:
            role, bport = record.get("role"), record.get("bootstrap_port")
            modes = {x.role for x in router.workers.all()}
            if role not in ("prefill", "decode", "mixed") or (bport is not None and not is_integer(bport)) or (
                    modes and ("mixed" in modes) != (role == "mixed")):
                log.warning("shared worker record ignored: it does not fit this router",
                            extra={"worker": url, "role": role, "bootstrap_port": bport})
                return
            try:
                w = router.workers.add(worker(url, role, bport))
            except UsageError as exc:
                log.warning("shared worker record ignored", extra={"worker": url, "error": exc.message})
                return
            w.draining = bool(record.get("draining"))
            await self.health.check(w)
            self.warmer.poke()
            return
        w.draining = bool(record.get("draining"))


class WorkerRoutes:
    """The handlers of /admin/workers and /admin/pairs."""

    def __init__(self, router: Router, changes: WorkerChanges, replicas: StateSync | None) -> None:
        self.router = router
        self.changes = changes
        #: with a state store, every worker change goes through it to every replica
        self.replicas = replicas

    async def workers(self, request: web.Request) -> web.Response:
        now = self.router.clock()
        kv = self.router.kv
        return json_response({"workers": [{**w.as_dict(now), **worker_doc(kv, w.url, w.role)}
                                  for w in self.router.workers.all()]})

    async def add_worker(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        url, role = body.get("url"), body.get("role")
        if not isinstance(url, str) or role not in ("prefill", "decode", "mixed"):
            return error_response(400, "give url and role (prefill, decode or mixed)")
        bport = body.get("bootstrap_port")
        if bport is not None and (role != "prefill" or not is_integer(bport) or not 1 <= bport <= 65535):
            return error_response(400, "bootstrap_port is a prefill's port number (1..65535), or null")
        try:
            spec: WorkerSpec = (parse_prefill(url) if role == "prefill" and bport is None
                                else worker(url, role, bport))
            probe = self.router.workers.by_url
            if spec.url in probe:
                return error_response(409, f"worker {spec.url} is already registered")
            modes = {w.role for w in self.router.workers.all()}
            if modes and (("mixed" in modes) != (spec.role == "mixed")):
                return error_response(400, "cannot mix collocated and prefill/decode workers in one router")
        except UsageError as exc:
            return error_response(400, exc.message)
        if self.replicas is not None:
            refused = await self._shared_worker(spec.url, {"present": True, **spec.as_dict(), "draining": False})
            if refused is not None:
                return refused
            shared = self.router.workers.by_url.get(spec.url)
            if shared is None:
                return error_response(409, f"worker {spec.url} was not added (see the router's log)")
            state = shared
        else:
            try:
                state = self.router.workers.add(spec)
            except UsageError as exc:  # several router processes: every shared worker slot was used
                return error_response(400, f"{exc.message}; {exc.remedy}")
            await self.changes.health.check(state)
            self.changes.warmer.poke()
        return json_response({"added": state.as_dict(self.router.clock())}, 201)

    async def remove_worker(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        url = str(body.get("url", "")).rstrip("/")
        if url and "://" not in url:
            url = "http://" + url
        w = self.router.workers.by_url.get(url)
        if w is None:
            return error_response(404, f"no worker {url!r}; see `inferctl router workers`")
        if self.replicas is not None:
            refused = await self._shared_worker(url, {"present": False, **w.spec.as_dict(), "draining": False})
            if refused is not None:
                return refused
        else:
            self.changes.forget(url)
        return json_response({"removed": url})

    async def _shared_worker(self, url: str, record: dict[str, Any]) -> web.Response | None:
        assert self.replicas is not None
        try:
            await self.replicas.change_worker(url, record)
        except StoreUnavailable as exc:
            return error_response(503, str(exc))
        return None

    async def drain_worker(self, request: web.Request) -> web.Response:
        """Stop routing new requests to a worker and wait (up to `timeout_s`, default 30) until its
        in-flight requests finished; `"drain": false` undoes it. The caller removes it afterwards."""
        body = await json_body(request)
        url = norm_url(body.get("url"))
        w = self.router.workers.by_url.get(url)
        if w is None:
            return error_response(404, f"no worker {url!r}; see `inferctl router workers`")
        timeout = body.get("timeout_s", 30.0)
        if not is_number(timeout) or not 0 <= timeout <= 3600:
            return error_response(400, "timeout_s must be a number of seconds in 0..3600")
        draining = body.get("drain") is not False
        if self.replicas is not None:
            refused = await self._shared_worker(url, {"present": True, **w.spec.as_dict(), "draining": draining})
            if refused is not None:
                return refused
        else:  # with a store, the shared change set it (unless a later one from another replica overtook it)
            w.draining = draining
        if not draining:
            return json_response({"worker": url, "draining": False, "inflight": w.load_inflight})
        deadline = self.router.clock() + timeout
        while w.load_inflight > 0 and self.router.clock() < deadline and not w.removed:
            await asyncio.sleep(0.02)
        log.warning("worker drained" if w.load_inflight == 0 else "worker drain timed out",
                    extra={"worker": url, "inflight": w.load_inflight})
        return json_response({"worker": url, "draining": True, "drained": w.load_inflight == 0, "inflight": w.load_inflight})

    async def pairs(self, request: web.Request) -> web.Response:
        """Every prefill x decode pair the router knows something about (router/fleet/pair_health.py)."""
        tracker = self.router.pairs
        return json_response({"pairs": tracker.health.snapshot(self.router.clock()), "avoided": tracker.avoided,
                      "fallbacks": tracker.fallbacks})

    async def push_pair(self, request: web.Request) -> web.Response:
        """A pair test's verdict (the audit pushes its P x D results): {prefill, decode, status: ok|fail,
        reason}. A failed pair is avoided until a later push says it passed."""
        body = await json_body(request)
        pre, dec, status = norm_url(body.get("prefill")), norm_url(body.get("decode")), body.get("status")
        by_url = self.router.workers.by_url
        if status not in ("ok", "fail") or pre not in by_url or dec not in by_url:
            return error_response(400, "give prefill and decode (registered worker URLs) and status ok or fail; see "
                        "`inferctl router workers`")
        if by_url[pre].role != "prefill" or by_url[dec].role != "decode":
            return error_response(400, f"{pre} and {dec} are not a prefill and a decode")
        reason = body.get("reason")
        st = self.router.pairs.health.push(pre, dec, status, str(reason) if reason else None, self.router.clock())
        log.warning("pair test verdict", extra={"prefill": pre, "decode": dec, "status": status, "reason": reason})
        return json_response({"pair": st.as_dict(self.router.clock())})
