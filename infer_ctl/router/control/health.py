"""Active health checks: /health, plus /server_info (restart detection, eviction policy) and /v1/loads
(queue length, KV capacity). In-flight requests on a worker that goes unhealthy are failed at once
(their connections closed) so that they are retried elsewhere instead of waiting for a timeout. `health_failures` consecutive failures mark a worker unhealthy,
`health_successes` consecutive successes mark it healthy again. A worker that goes unhealthy or
restarts (its /server_info start time changed) loses its prefix-index entries and named-prefix
placements: its cache is gone, and routing on it would predict hits that no longer exist
(llm-d-router#2853). A request that hits a transport error triggers an immediate check.

Flap damping (core/routing/flap.py): a worker that goes unhealthy again less than FLAP_STABLE_S after it
was let back (a crash loop: it starts, answers /health, fails the requests sent to it, is restarted)
is let back only after a hold-down, HOLDDOWN_BASE_S doubling with each flap in a row up to
`health_holddown_max_s`, during which it is still probed and must answer every check. Each readmission
of a crash-looping worker costs the requests sent to it (failed over, retried) and a rebuild of its
exact KV index from seq 0; a first ejection has no hold-down (back as fast as without damping)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from infer_ctl.core.engine_identity import identify
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http.jsonio import loads
from infer_ctl.router.http.upstream import UpstreamError
from infer_ctl.router.request.proxy import Router

log = logging.getLogger("infer_ctl.router.health")

#: how often a worker that is down is probed between two health rounds, in seconds
DOWN_PROBE_S = 1.0
#: the hold-down of a worker's first flap, doubled by each further one in a row: as long as one probe
#: period (a second flap costs about one more probe), 1, 2, 4 ... 32 s by the 6th flap, then the cap
HOLDDOWN_BASE_S = 1.0
#: a worker healthy this long after its readmission is stable: its flaps are forgotten, and going down
#: later is a first ejection again. A minute covers a crash loop that serves a few requests before it
#: fails (seconds to tens of seconds) while a worker that ran a minute is not held for an old crash
FLAP_STABLE_S = 60.0


def _instance(info: Any) -> tuple[str | None, bool]:
    if not isinstance(info, dict):
        return None, False
    start = info.get("startup_time") or info.get("start_time") or (info.get("sim") or {}).get("start_time")
    return (None if start is None else str(start)), info.get("radix_eviction_policy") == "priority"


def _loads(doc: Any) -> tuple[int, int, int | None]:
    ranks = doc.get("loads") if isinstance(doc, dict) else doc
    if isinstance(ranks, dict):
        ranks = [ranks]
    if not isinstance(ranks, list):
        return 0, 0, None
    queued = sum(int(r.get("num_waiting_reqs", 0) or 0) for r in ranks if isinstance(r, dict))
    running = sum(int(r.get("num_running_reqs", 0) or 0) for r in ranks if isinstance(r, dict))
    caps = [r.get("max_total_num_tokens") for r in ranks if isinstance(r, dict)]
    cap = sum(int(c) for c in caps if isinstance(c, int | float)) or None
    return queued, running, cap


def _used(doc: Any) -> int:
    """KV tokens in use over the ranks (/v1/loads num_used_tokens)."""
    ranks = doc.get("loads") if isinstance(doc, dict) else doc
    ranks = [ranks] if isinstance(ranks, dict) else ranks if isinstance(ranks, list) else []
    return sum(int(r.get("num_used_tokens", 0) or 0) for r in ranks if isinstance(r, dict))


class HealthChecker:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._checking: set[str] = set()
        #: what answers at each worker (core/sglang/identity.py), logged when first seen and when it changes
        self._engines: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        #: checks started outside a round (a probe of a worker that is down, a suspect): stopped with it
        self._probes: set[asyncio.Task[None]] = set()

    def _identify(self, w: WorkerState, status: int, doc: Any) -> None:
        """Say what answers at a worker (SGLang at the tested version, another version, the simulator, or
        not SGLang), from its decoded /server_info: once at start-up and again when it changes (a relaunch
        with another venv)."""
        ident = identify(doc, status=status)
        if self._engines.get(w.url) == ident.summary:
            return
        self._engines[w.url] = ident.summary
        level = logging.INFO if ident.kind in ("sglang", "simulator") else logging.WARNING
        log.log(level, "what answers at the worker: %s", ident.summary, extra={"worker": w.url, "role": w.role,
                                                           "engine": ident.kind, "engine_version": ident.version})

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """The rounds and every check still in flight (probes, suspects) end here, before the KV
        streams are stopped (server.py), none of them left to answer into a closing router."""
        tasks = [t for t in (self._task, *self._probes) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in self.router.workers.all()), return_exceptions=True)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self.check_all()
            # between two rounds a worker that is down is probed every DOWN_PROBE_S: a restarted one
            # (its cache empty: the fleet's cheapest place for new prefixes) takes traffic again
            # within that of answering, not up to health_interval_s later. Each probe runs on its own,
            # one at a time per worker (`_checking`): a worker that accepts and never answers holds up
            # neither the others' probes nor the next round for its health_timeout_s
            until = loop.time() + self.router.cfg.settings.health_interval_s
            while (left := until - loop.time()) > 0:
                await asyncio.sleep(min(DOWN_PROBE_S, left))
                if until - loop.time() > 0.05:
                    for w in self.router.workers.all():
                        if not w.healthy:
                            self._start(w)

    def suspect(self, w: WorkerState) -> None:
        self._start(w)

    def _start(self, w: WorkerState) -> None:
        if w.url not in self._checking and not w.removed:
            t = asyncio.ensure_future(self.check(w))
            self._probes.add(t)
            t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[None]) -> None:
        self._probes.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("health check failed: %s", t.exception())

    async def check(self, w: WorkerState) -> None:
        if w.url in self._checking:
            return
        self._checking.add(w.url)
        up = self.router.upstreams
        try:
            ok, instance, prio, load = False, None, False, None
            try:
                async with asyncio.timeout(self.router.cfg.settings.health_timeout_s):
                    status, _ = await up.fetch(w.url, "GET", "/health")
                    ok = status == 200
                    if ok:
                        s2, info = await up.fetch(w.url, "GET", "/server_info")
                        try:  # decoded once, for the identity and everything below
                            info_doc = loads(info) if s2 == 200 else None
                        except ValueError:
                            self._identify(w, s2, None)
                            raise
                        self._identify(w, s2, info_doc)
                        if info_doc is not None:
                            instance, prio = _instance(info_doc)
                            self._bootstrap_port(w, info_doc)
                            # KV events: discovery (router/kvindex/kv_routing.py; a decode only with a radix cache)
                            self.router.kv.configure(w.url, info_doc, w.role)
                            if w.role != "prefill":
                                self.router.spec.observe_server_info(w.url, info_doc)
                        s3, ld = await up.fetch(w.url, "GET", "/v1/loads")
                        if s3 == 200:
                            load_doc = loads(ld)
                            load = _loads(load_doc)
                            if w.role == "decode":  # decode chosen by capacity (fleet/workers.py kv_free)
                                w.kv_total, w.kv_used = load[2], _used(load_doc)
                            self.router.pairs.kv_poll(w, load_doc)  # a prefill's last KV transfer
            except (UpstreamError, TimeoutError, ValueError) as exc:
                w.last_error = f"health check: {exc or type(exc).__name__}"
                ok = ok and isinstance(exc, ValueError)
            self.apply(w, ok, instance, prio, load)
        finally:
            self._checking.discard(w.url)

    def _bootstrap_port(self, w: WorkerState, info: Any) -> None:
        """A prefill given without a bootstrap port gets the one it reports (`disaggregation_bootstrap_port`
        in /server_info): sent as null, a decode would use its *own* --disaggregation-bootstrap-port and
        every transfer fails when the two differ. A configured port that differs from the reported one is
        kept (the operator may know a NAT or proxy), but logged, once per reported value."""
        if w.role != "prefill" or not isinstance(info, dict):
            return
        port = info.get("disaggregation_bootstrap_port")
        if not isinstance(port, int) or isinstance(port, bool) or port == w.bootstrap_reported:
            return
        w.bootstrap_reported = port
        if w.spec.bootstrap_port is None:
            w.spec = dataclasses.replace(w.spec, bootstrap_port=port)
            log.warning("prefill had no bootstrap port configured: using the port it reports",
                        extra={"worker": w.url, "bootstrap_port": port})
        elif w.spec.bootstrap_port != port:
            log.warning("prefill reports a different bootstrap port than configured: PD transfers will fail "
                        "unless something forwards the configured one; fix URL@PORT",
                        extra={"worker": w.url, "configured": w.spec.bootstrap_port, "reported": port})

    def apply(self, w: WorkerState, ok: bool, instance: str | None, prio: bool,
              load: tuple[int, int, int | None] | None) -> None:
        router = self.router
        if w.removed:
            return
        now = router.clock()
        if not w.healthy:
            w.flap.checked(ok, now)
        if ok:
            w.health_failures = 0
            w.health_successes += 1
            if instance is not None:
                if w.instance is not None and instance != w.instance:
                    w.restarts += 1
                    router.kv.restarted(w.url)  # its exact index is learned again from seq 0
                    router.spec.reset(w.url)  # its acceptance was measured on the process that is gone
                    router.pairs.restarted(w.url)  # so were its pairs' failed KV transfers
                    if w.healthy and self._eject(w, now) <= 0:
                        # in, it crashed and came back between two checks: an ejection it is back from at
                        # once, unless that makes it a flap (then it serves the hold-down as any flapping
                        # worker does: a crash loop faster than the checks is damped too)
                        self._forget(w, "restarted", flaps=w.flap.flaps, ejections=w.flap.ejections)
                        w.flap.readmit(now)
                    elif w.healthy:
                        self._take_out(w, "restarted again soon after it came back")
                        w.flap.restarted(now)
                        w.health_successes = 1
                    else:  # out: a restart is a crash in its hold-down (flap.py), and the passing
                        self._forget(w, "restarted")  # checks in a row it comes back on are the new process's
                        w.flap.restarted(now)
                        w.health_successes = 1
                w.instance = instance
            w.radix_priority = prio
            if load is not None:
                w.polled_at = now
                w.queued, w.running, cap = load
                w.external = max(0, w.queued + w.running - w.load_inflight)
                if cap and w.role in ("prefill", "mixed"):
                    w.max_total_tokens = cap
                    blocks = int(cap * router.chars_per_token / router.index.block_chars)
                    router.index.set_capacity(w.url, blocks)
            if w.healthy:
                w.flap.settle(now, FLAP_STABLE_S)
            elif w.health_successes >= router.cfg.settings.health_successes and w.flap.admits(now):
                # the hold-down it served, and the passing checks in a row it was let back on
                back = {"worker": w.url, "holddown_s": w.flap.holddown_s, "checks": w.health_successes}
                w.healthy = True
                w.flap.readmit(now)
                router.kv.up(w.url)
                w.breaker.reset()
                log.warning("worker healthy again", extra=back)
        else:
            w.health_successes = 0
            w.health_failures += 1
            if w.healthy and w.health_failures >= router.cfg.settings.health_failures:
                self._eject(w, now)
                self._take_out(w, "unhealthy")

    def _eject(self, w: WorkerState, now: float) -> float:
        """The worker went out at `now` (flap.py): the hold-down it gets before it is let back."""
        return w.flap.eject(now, base_s=HOLDDOWN_BASE_S, cap_s=self.router.cfg.settings.health_holddown_max_s,
                            stable_s=FLAP_STABLE_S)

    def _take_out(self, w: WorkerState, why: str) -> None:
        router = self.router
        w.healthy = False
        # the one line per ejection: the hold-down chosen, and the flaps in a row that chose it
        self._forget(w, why, holddown_s=w.flap.holddown_s, flaps=w.flap.flaps, ejections=w.flap.ejections)
        router.kv.down(w.url)  # the exact index too: what it held is unknown now
        # Requests still waiting on it would hang until their timeout (a hung or half-dead worker never
        # answers): close their connections so they fail now and are retried.
        router.upstreams.drop(w.url)
        router.coalesce.worker_down(w.url)  # and those held for another process's request there

    def _forget(self, w: WorkerState, why: str, **extra: Any) -> None:
        dropped = self.router.index.drop_worker(w.url)
        self.router.prefixes.drop_worker(w.url)
        log.warning(f"worker {why}: dropped its prefix-index entries",
                    extra={"worker": w.url, "entries": dropped, **extra})
