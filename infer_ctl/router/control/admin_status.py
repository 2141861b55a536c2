"""The operator API's status and reports (/admin/status, /admin/tenants, /admin/spec, /admin/pd): what the
router holds, and what the speculative and PD controllers report they did."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from infer_ctl.router.control.admin_http import error_response, json_body, json_response
from infer_ctl.router.fleet.metrics import counter_value, histogram_totals
from infer_ctl.router.request.proxy import Router
from infer_ctl.router.scaleout.metrics_merge import add_counters
from infer_ctl.router.scaleout.state_sync import StateSync

log = logging.getLogger("infer_ctl.router")
#: what the speculative controller reports (docs/speculative.md)
SPEC_ACTIONS = ("alert", "advise", "relaunch", "restore", "failed")
#: what `inferctl pd control` reports (launch/pd_control.py); `stale` and `hold` are decisions, recorded too
PD_ACTIONS = ("advise", "switch", "cover", "restore", "failed", "refused", "stale", "hold")


def _spec_summary(snap: dict[str, Any]) -> dict[str, Any]:
    """Per decode: the window's alpha, accept length and rate, and its live step count."""
    return {"window_requests": snap["window_requests"],
            "decodes": {d["url"]: {"num_steps": d["num_steps"], "adaptive": d["adaptive"], **d["window"]}
                        for d in snap["decodes"]},
            "actions": len(snap["actions"])}


def process_counters(router: Router) -> dict[str, Any]:
    """This process's request counters that /admin/status adds up over the router's processes."""
    return {"first_sight": dict(router.kv.first_sight), "coalesce": router.coalesce.counters()}


class StatusRoutes:
    """The handlers of /admin/status, /admin/tenants, /admin/spec and /admin/pd."""

    def __init__(self, router: Router, replicas: StateSync | None,
                 peer_counters: Callable[[], list[dict[str, Any]]] | None = None) -> None:
        self.router = router
        #: several replicas: the state store's status
        self.replicas = replicas
        #: several router processes: the others' counters (metrics_merge.ProcessMetrics.peer_counters)
        self.peer_counters = peer_counters

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
            **({"state_store": self.replicas.status_doc()} if self.replicas is not None else {}),
            **self._processes(),
        }

    def _counted(self, kv: dict[str, Any], co: dict[str, Any]) -> dict[str, Any]:
        """`kv_events` and `coalesce` of the status, with several processes (router/daemon/procs.py) their
        counters summed over every live process (router/scaleout/metrics_merge.py: this is the leader, the others'
        are their files, at most a second or two old), and how many processes were counted."""
        peers = self.peer_counters() if self.peer_counters is not None else []
        if not peers:
            return {"kv_events": kv, "coalesce": co}
        total = add_counters([process_counters(self.router), *peers])
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
        return json_response(self.status_doc())

    async def tenants(self, request: web.Request) -> web.Response:
        """Per tenant: limits, buckets, in flight, requests, tokens, cost (router/observe/tenants.py)."""
        obs = self.router.observing
        tenancy = obs.tenancy if obs is not None else None
        return json_response(tenancy.snapshot() if tenancy is not None else {"mode": "off", "tenants": []})

    async def spec(self, request: web.Request) -> web.Response:
        return json_response(self.router.spec.snapshot())

    async def spec_action(self, request: web.Request) -> web.Response:
        """The speculative controller reports what it did (or advised): logged, counted, kept for status."""
        body = await json_body(request)
        pool, action = body.get("pool"), body.get("action")
        if not isinstance(pool, str) or not pool or action not in SPEC_ACTIONS:
            return error_response(400, f"give pool (a name) and action ({', '.join(SPEC_ACTIONS)})")
        record = {k: v for k, v in body.items() if isinstance(k, str)}
        self.router.spec.record_action(record)
        self.router.metrics.spec_actions.labels(pool, action).inc()
        log.warning("speculative controller action", extra={"pool": pool, "action": action,
                                                             "detail": body.get("message")})
        return json_response({"recorded": record}, 201)

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
        return json_response({"workers": workers, "counters": {
            "ttft_sum": ttft[0], "ttft_count": ttft[1], "itl_sum": itl[0], "itl_count": itl[1],
            "prompt_tokens": int(counter_value(m.prompt_tokens)), "requests": m.answered}})

    async def pd_action(self, request: web.Request) -> web.Response:
        """The PD balance controller reports what it did or decided: logged, counted, and a span when the
        router traces (the controller's own process holds no exporter: the router's is the one configured)."""
        body = await json_body(request)
        action, to_role = body.get("action"), body.get("to_role")
        if action not in PD_ACTIONS or to_role not in (None, "prefill", "decode"):
            return error_response(400, f"give action ({', '.join(PD_ACTIONS)}) and to_role (prefill, decode or null)")
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
        return json_response({"recorded": record}, 201)
