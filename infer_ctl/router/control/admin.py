"""The operator API under /admin (bearer token from an environment variable; see config.validate for the
rule that refuses a non-loopback listener without one)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from infer_ctl.core.routing.prefixes import KEEP_CHOICES, PrefixRegistry
from infer_ctl.errors import UsageError
from infer_ctl.profile.router import MAX_PREFIX_REPLICAS, PREFIX_NAME_PATTERN
from infer_ctl.router.config import WorkerSpec, parse_prefill, worker
from infer_ctl.router.control.warmer import PrefixWarmer
from infer_ctl.router.fleet.metrics import counter_value, histogram_totals
from infer_ctl.router.http.jsonio import DecodeError, dumps, error_body, loads
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout.follow import forget_worker
from infer_ctl.router.scaleout.metrics_merge import add_counters
from infer_ctl.router.scaleout.state_sync import StateSync, StoreUnavailable, VerbRefused

log = logging.getLogger("infer_ctl.router")
#: what the speculative controller reports (docs/speculative.md)
SPEC_ACTIONS = ("alert", "advise", "relaunch", "restore", "failed")
#: what `inferctl pd control` reports (launch/pd_control.py); `stale` and `hold` are decisions, recorded too
PD_ACTIONS = ("advise", "switch", "cover", "restore", "failed", "refused", "stale", "hold")


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=dumps(obj), content_type="application/json")


def _err(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=error_body(status, message), content_type="application/json")


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _norm(url: Any) -> str:
    url = str(url or "").rstrip("/")
    return url if not url or "://" in url else "http://" + url


def _spec_summary(snap: dict[str, Any]) -> dict[str, Any]:
    """Per decode: the window's alpha, accept length and rate, and its live step count."""
    return {"window_requests": snap["window_requests"],
            "decodes": {d["url"]: {"num_steps": d["num_steps"], "adaptive": d["adaptive"], **d["window"]}
                        for d in snap["decodes"]},
            "actions": len(snap["actions"])}


def _known(call: Any, missing: str) -> Any:
    """An admin verb on one named prefix: a name the registry does not know is a 404 naming it."""
    def verb(reg: PrefixRegistry, now: float) -> Any:
        try:
            return call(reg, now)
        except KeyError:
            raise VerbRefused(404, f"{missing}; see `inferctl router prefixes`", "not_found") from None
    return verb


def authorized(token: str | None, header: str) -> bool:
    """Whether an Authorization header carries the admin token (always true when none is configured).
    The scheme is case-insensitive (RFC 9110 §11.1: `bearer x` is the same as `Bearer x`)."""
    if not token:
        return True
    scheme, _, cred = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(cred.strip().encode(), token.encode())


class Admin:
    def __init__(self, router: Router, warmer: PrefixWarmer, health: Any) -> None:
        self.router = router
        self.warmer = warmer
        self.health = health
        cfg = router.cfg
        #: with a state store, every change of named prefixes and workers goes through it to every replica
        self.sync = StateSync(router, url=cfg.settings.state_store, password=cfg.state_store_password,
                              namespace=cfg.state_namespace, apply_worker=self.apply_worker,
                              on_prefix_change=warmer.poke) if cfg.settings.state_store else None
        #: the leader of several router processes: write the snapshot (follow.py) before a change is
        #: answered, so a change the client saw acknowledged survives the leader's death right after
        self.on_change: Any = None
        #: several router processes: the others' counters (metrics_merge.ProcessMetrics.peer_counters)
        self.peer_counters: Callable[[], list[dict[str, Any]]] | None = None

    def routes(self, app: web.Application) -> None:
        # Auth wraps the admin handlers only: a middleware would run on every data-plane request too.
        r = app.router
        g = self._guarded
        r.add_get("/admin/status", g(self.status))
        r.add_get("/admin/workers", g(self.workers))
        r.add_post("/admin/workers", g(self.add_worker))
        r.add_post("/admin/workers/remove", g(self.remove_worker))
        r.add_post("/admin/workers/drain", g(self.drain_worker))
        r.add_get("/admin/spec", g(self.spec))
        r.add_get("/admin/tenants", g(self.tenants))
        r.add_post("/admin/spec/actions", g(self.spec_action))
        r.add_get("/admin/pd", g(self.pd))
        r.add_post("/admin/pd/actions", g(self.pd_action))
        r.add_get("/admin/pairs", g(self.pairs))
        r.add_post("/admin/pairs", g(self.push_pair))
        r.add_get("/admin/prefixes", g(self.prefixes))
        r.add_post("/admin/prefixes", g(self.add_prefix))
        r.add_post("/admin/prefixes/{name}/expire", g(self.expire_prefix))
        r.add_post("/admin/prefixes/{name}/warm", g(self.warm_prefix))
        r.add_post("/admin/prefixes/{name}/remove", g(self.remove_prefix))

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

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = loads(await request.read())
        except (DecodeError, ValueError):
            raise web.HTTPBadRequest(body=error_body(400, "malformed JSON body"),
                                     content_type="application/json") from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(body=error_body(400, "the body must be a JSON object"),
                                     content_type="application/json")
        return body

    def status_doc(self) -> dict[str, Any]:
        router = self.router
        now = router.clock()
        workers = router.workers.all()
        return {
            "mode": router.mode,
            "policy": router.policy.policy,
            "miss_placement": router.policy.miss_placement,
            "listen": router.cfg.url,
            "draining": router.draining,
            "active_requests": router.active,
            "queued_requests": router.waiting,
            "workers": {"total": len(workers), "available": sum(w.available(now) for w in workers),
                        # answering their checks, kept out by their flap hold-down (router/control/health.py)
                        "held": sum(w.flap_doc(now)["held"] for w in workers)},
            "index": {"blocks": len(router.index), "block_chars": router.index.block_chars,
                      "ttl_s": router.index.ttl_s, "evicted": router.index.evicted, "expired": router.index.expired},
            "chars_per_token": round(router.chars_per_token, 3),
            "prefixes": {"active": sum(r.state.value == "active" for r in router.prefixes.records()),
                         "total": len(router.prefixes.records())},
            "speculative": _spec_summary(router.spec.snapshot()),
            **self._counted(router.kv.status_doc(), router.coalesce.status_doc()),
            **({"state_store": self.sync.status_doc()} if self.sync is not None else {}),
            **self._processes(),
        }

    def counters(self) -> dict[str, Any]:
        """This process's request counters that /admin/status adds up over the router's processes."""
        return {"first_sight": dict(self.router.kv.first_sight), "coalesce": self.router.coalesce.counters()}

    def _counted(self, kv: dict[str, Any], co: dict[str, Any]) -> dict[str, Any]:
        """`kv_events` and `coalesce` of the status, with several processes (router/daemon/procs.py) their
        counters summed over every live process (router/scaleout/metrics_merge.py: this is the leader, the others'
        are their files, at most a second or two old), and how many processes were counted."""
        peers = self.peer_counters() if self.peer_counters is not None else []
        if not peers:
            return {"kv_events": kv, "coalesce": co}
        total = add_counters([self.counters(), *peers])
        if "first_sight" in kv:
            fs = total["first_sight"]
            kv = {**kv, "first_sight": {**fs, "seconds": round(fs.get("seconds", 0.0), 3)}}
        co = {**co, **total["coalesce"]}  # add_counters keeps this process's keys: the four counts
        return {"kv_events": kv, "coalesce": co, "counters_processes": 1 + len(peers)}

    def _processes(self) -> dict[str, Any]:
        """Several router processes (router/daemon/procs.py): each one's upstream calls in flight, from the shared
        load block; `active_requests` and `queued_requests` above are this (the leader's) process's."""
        shared = self.router.workers.shared
        if shared is None:
            return {}
        return {"processes": [{"index": i, "upstream_inflight": sum(shared.row(i))} for i in range(shared.processes)]}

    async def status(self, request: web.Request) -> web.Response:
        return _json(self.status_doc())

    async def workers(self, request: web.Request) -> web.Response:
        now = self.router.clock()
        kv = self.router.kv
        return _json({"workers": [{**w.as_dict(now), **kv.worker_doc(w.url, w.role)}
                                  for w in self.router.workers.all()]})

    async def add_worker(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        url, role = body.get("url"), body.get("role")
        if not isinstance(url, str) or role not in ("prefill", "decode", "mixed"):
            return _err(400, "give url and role (prefill, decode or mixed)")
        bport = body.get("bootstrap_port")
        if bport is not None and (role != "prefill" or not _integer(bport) or not 1 <= bport <= 65535):
            return _err(400, "bootstrap_port is a prefill's port number (1..65535), or null")
        try:
            spec: WorkerSpec = (parse_prefill(url) if role == "prefill" and bport is None
                                else worker(url, role, bport))
            probe = self.router.workers.by_url
            if spec.url in probe:
                return _err(409, f"worker {spec.url} is already registered")
            modes = {w.role for w in self.router.workers.all()}
            if modes and (("mixed" in modes) != (spec.role == "mixed")):
                return _err(400, "cannot mix collocated and prefill/decode workers in one router")
        except UsageError as exc:
            return _err(400, exc.message)
        if self.sync is not None:
            refused = await self._shared_worker(spec.url, {"present": True, **spec.as_dict(), "draining": False})
            if refused is not None:
                return refused
            shared = self.router.workers.by_url.get(spec.url)
            if shared is None:
                return _err(409, f"worker {spec.url} was not added (see the router's log)")
            state = shared
        else:
            try:
                state = self.router.workers.add(spec)
            except UsageError as exc:  # several router processes: every shared worker slot was used
                return _err(400, f"{exc.message}; {exc.remedy}")
            await self.health.check(state)
            self.warmer.poke()
        return _json({"added": state.as_dict(self.router.clock())}, 201)

    async def remove_worker(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        url = str(body.get("url", "")).rstrip("/")
        if url and "://" not in url:
            url = "http://" + url
        w = self.router.workers.by_url.get(url)
        if w is None:
            return _err(404, f"no worker {url!r}; see `inferctl router workers`")
        if self.sync is not None:
            refused = await self._shared_worker(url, {"present": False, **w.spec.as_dict(), "draining": False})
            if refused is not None:
                return refused
        else:
            self._forget_worker(url)
        return _json({"removed": url})

    def _forget_worker(self, url: str) -> None:
        forget_worker(self.router, url)
        self.warmer.poke()

    async def _shared_worker(self, url: str, record: dict[str, Any]) -> web.Response | None:
        assert self.sync is not None
        try:
            await self.sync.change_worker(url, record)
        except StoreUnavailable as exc:
            return _err(503, str(exc))
        return None

    async def apply_worker(self, url: str, record: dict[str, Any]) -> None:
        """A worker change from the state store (this replica's or another's): add, remove, (un)drain."""
        router = self.router
        w = router.workers.by_url.get(url)
        if not record.get("present"):
            if w is not None:
                self._forget_worker(url)
                log.warning("worker removed (shared change)", extra={"worker": url})
            return
        if w is None:
            role, bport = record.get("role"), record.get("bootstrap_port")
            modes = {x.role for x in router.workers.all()}
            if role not in ("prefill", "decode", "mixed") or (bport is not None and not _integer(bport)) or (
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

    async def drain_worker(self, request: web.Request) -> web.Response:
        """Stop routing new requests to a worker and wait (up to `timeout_s`, default 30) until its
        in-flight requests finished; `"drain": false` undoes it. The caller removes it afterwards."""
        body = await self._body(request)
        url = _norm(body.get("url"))
        w = self.router.workers.by_url.get(url)
        if w is None:
            return _err(404, f"no worker {url!r}; see `inferctl router workers`")
        timeout = body.get("timeout_s", 30.0)
        if not _number(timeout) or not 0 <= timeout <= 3600:
            return _err(400, "timeout_s must be a number of seconds in 0..3600")
        draining = body.get("drain") is not False
        if self.sync is not None:
            refused = await self._shared_worker(url, {"present": True, **w.spec.as_dict(), "draining": draining})
            if refused is not None:
                return refused
        else:  # with a store, the shared change set it (unless a later one from another replica overtook it)
            w.draining = draining
        if not draining:
            return _json({"worker": url, "draining": False, "inflight": w.load_inflight})
        deadline = self.router.clock() + timeout
        while w.load_inflight > 0 and self.router.clock() < deadline and not w.removed:
            await asyncio.sleep(0.02)
        log.warning("worker drained" if w.load_inflight == 0 else "worker drain timed out",
                    extra={"worker": url, "inflight": w.load_inflight})
        return _json({"worker": url, "draining": True, "drained": w.load_inflight == 0, "inflight": w.load_inflight})

    async def tenants(self, request: web.Request) -> web.Response:
        """Per tenant: limits, buckets, in flight, requests, tokens, cost (router/observe/tenants.py)."""
        obs = self.router.observing
        tenancy = obs.tenancy if obs is not None else None
        return _json(tenancy.snapshot() if tenancy is not None else {"mode": "off", "tenants": []})

    async def spec(self, request: web.Request) -> web.Response:
        return _json(self.router.spec.snapshot())

    async def spec_action(self, request: web.Request) -> web.Response:
        """The speculative controller reports what it did (or advised): logged, counted, kept for status."""
        body = await self._body(request)
        pool, action = body.get("pool"), body.get("action")
        if not isinstance(pool, str) or not pool or action not in SPEC_ACTIONS:
            return _err(400, f"give pool (a name) and action ({', '.join(SPEC_ACTIONS)})")
        record = {k: v for k, v in body.items() if isinstance(k, str)}
        self.router.spec.record_action(record)
        self.router.metrics.spec_actions.labels(pool, action).inc()
        log.warning("speculative controller action", extra={"pool": pool, "action": action,
                                                             "detail": body.get("message")})
        return _json({"recorded": record}, 201)

    async def pd(self, request: web.Request) -> web.Response:
        """The pools as `inferctl pd control` judges them (core/pd/control.py): each worker's role, state and
        load with the age of its last load poll (a stale view switches nothing), and the cumulative counters
        its window is the difference of: streamed TTFT and ITL, prompt tokens, requests answered. With
        several router processes the counters are this (the leader's) process's share."""
        router = self.router
        now = router.clock()
        m = router.metrics
        ttft, itl = histogram_totals(m.ttft), histogram_totals(m.itl)
        workers = [{"url": w.url, "role": w.role, "available": w.available(now), "healthy": w.healthy,
                    "draining": w.draining, "inflight": w.load_inflight, "queued": w.queued, "running": w.running,
                    "load_age_s": None if w.polled_at is None else round(max(0.0, now - w.polled_at), 3)}
                   for w in router.workers.all()]
        return _json({"workers": workers, "counters": {
            "ttft_sum": ttft[0], "ttft_count": ttft[1], "itl_sum": itl[0], "itl_count": itl[1],
            "prompt_tokens": int(counter_value(m.prompt_tokens)), "requests": m.answered}})

    async def pd_action(self, request: web.Request) -> web.Response:
        """The PD balance controller reports what it did or decided: logged, counted, and a span when the
        router traces (the controller's own process holds no exporter: the router's is the one configured)."""
        body = await self._body(request)
        action, to_role = body.get("action"), body.get("to_role")
        if action not in PD_ACTIONS or to_role not in (None, "prefill", "decode"):
            return _err(400, f"give action ({', '.join(PD_ACTIONS)}) and to_role (prefill, decode or null)")
        record = {k: v for k, v in body.items() if isinstance(k, str)}
        self.router.metrics.pd_actions.labels(action, to_role or "").inc()
        log.warning("pd controller action", extra={"action": action, "server": body.get("server"),
                                                   "to_role": to_role, "detail": body.get("reason")})
        obs = self.router.observing
        tracing = obs.tracing if obs is not None else None
        if tracing is not None:
            span = tracing.tracer.start_span(f"pd {action}", kind=tracing.INTERNAL)
            for k in ("server", "from_role", "to_role", "covers", "reason"):
                if isinstance(body.get(k), str):
                    span.set_attribute(f"inferctl.pd.{k}", body[k])
            result = body.get("result")
            if isinstance(result, dict) and result.get("ok") is False:
                span.set_status(tracing.Status(tracing.ERROR, str(result.get("message", ""))[:200]))
            span.end()
        return _json({"recorded": record}, 201)

    async def pairs(self, request: web.Request) -> web.Response:
        """Every prefill x decode pair the router knows something about (router/fleet/pair_health.py)."""
        tracker = self.router.pairs
        return _json({"pairs": tracker.health.snapshot(self.router.clock()), "avoided": tracker.avoided,
                      "fallbacks": tracker.fallbacks})

    async def push_pair(self, request: web.Request) -> web.Response:
        """A pair test's verdict (the audit pushes its P x D results): {prefill, decode, status: ok|fail,
        reason}. A failed pair is avoided until a later push says it passed."""
        body = await self._body(request)
        pre, dec, status = _norm(body.get("prefill")), _norm(body.get("decode")), body.get("status")
        by_url = self.router.workers.by_url
        if status not in ("ok", "fail") or pre not in by_url or dec not in by_url:
            return _err(400, "give prefill and decode (registered worker URLs) and status ok or fail; see "
                        "`inferctl router workers`")
        if by_url[pre].role != "prefill" or by_url[dec].role != "decode":
            return _err(400, f"{pre} and {dec} are not a prefill and a decode")
        reason = body.get("reason")
        st = self.router.pairs.health.push(pre, dec, status, str(reason) if reason else None, self.router.clock())
        log.warning("pair test verdict", extra={"prefill": pre, "decode": dec, "status": status, "reason": reason})
        return _json({"pair": st.as_dict(self.router.clock())})

    async def prefixes(self, request: web.Request) -> web.Response:
        now = self.router.clock()
        return _json({"prefixes": [r.as_dict(now) for r in self.router.prefixes.records()]})

    async def _change(self, name: str, verb: Any) -> Any:
        """Run an operator verb on the named prefixes: here, or through the state store on every replica.
        Returns the verb's result, or the error response."""
        try:
            if self.sync is None:
                return verb(self.router.prefixes, self.router.clock())
            return await self.sync.change_prefix(name, verb)
        except VerbRefused as exc:
            return _err(exc.status, exc.message)  # the type a client sees follows the status
        except StoreUnavailable as exc:
            return _err(503, str(exc))

    def _local(self, rec: Any) -> Any:
        """This replica's copy of a record a verb returned (the verb may have run on the stored copy)."""
        return self.router.prefixes.get(rec.name, rec.version) or rec

    async def add_prefix(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        name, text = body.get("name"), body.get("text")
        if not isinstance(name, str) or not re.match(PREFIX_NAME_PATTERN, name) or not isinstance(text, str) or not text:
            return _err(400, "give name (letters, digits, '.', '_', '-'; up to 128) and text (non-empty)")

        def verb(reg: PrefixRegistry, now: float) -> Any:
            # A new version (or a renewal) keeps the latest version's settings unless the request gives
            # them: `prefixes add NAME --file v2.txt` must not silently drop K replicas, the pin, the TTL
            # and `keep`, also when that version has expired in the meantime.
            cur = reg.settings(name)
            ttl = body.get("ttl_s", cur[0] if cur else None)
            replicas = body["replicas"] if body.get("replicas") is not None else (cur[1] if cur else 1)
            pin = body["pin"] if body.get("pin") is not None else (cur[2] if cur else False)
            fmt = body["format"] if body.get("format") is not None else (cur[3] if cur else "text")
            keep = body.get("keep", cur[4] if cur else None)  # null: neither
            if (ttl is not None and (not _number(ttl) or ttl <= 0)) or not _integer(replicas) \
                    or not 1 <= replicas <= MAX_PREFIX_REPLICAS or not isinstance(pin, bool) or fmt not in ("text", "chat"):
                raise VerbRefused(400, f"ttl_s must be a number > 0 (or null: no TTL), replicas an integer "
                                  f"1..{MAX_PREFIX_REPLICAS}, pin a boolean, format text or chat", "invalid_request_error")
            if keep is not None and keep not in KEEP_CHOICES:
                raise VerbRefused(400, f"keep must be hbm, host or null, got {str(keep)[:20]!r}", "invalid_request_error")
            if keep == "host" and pin:
                raise VerbRefused(400, "keep host and pin conflict: pin keeps the prefix in HBM (give keep hbm, "
                                  "or pin false)", "invalid_request_error")
            return reg.register(name, text, now=now, ttl_s=ttl, replicas=replicas, pin=pin, fmt=fmt, keep=keep)

        rec = await self._change(name, verb)
        if isinstance(rec, web.Response):
            return rec
        self.warmer.poke()
        return _json({"prefix": self._local(rec).as_dict(self.router.clock())}, 201)

    async def expire_prefix(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        verb = _known(lambda reg, now: reg.expire(name, now), f"no active prefix {name!r}")

        rec = await self._change(name, verb)
        if isinstance(rec, web.Response):
            return rec
        return _json({"prefix": self._local(rec).as_dict(self.router.clock())})

    async def remove_prefix(self, request: web.Request) -> web.Response:
        """Forget a prefix altogether: every version, its placements and statistics."""
        name = request.match_info["name"]

        verb = _known(lambda reg, now: reg.remove(name), f"no prefix {name!r}")

        versions = await self._change(name, verb)
        if isinstance(versions, web.Response):
            return versions
        return _json({"removed": name, "versions": [r.version for r in versions]})

    async def warm_prefix(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]

        verb = _known(lambda reg, now: reg.request_warm(name, now), f"no active prefix {name!r}")

        rec = await self._change(name, verb)
        if isinstance(rec, web.Response):
            return rec
        self.warmer.poke()
        return _json({"prefix": self._local(rec).as_dict(self.router.clock())})
