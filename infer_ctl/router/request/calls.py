"""Calls to workers on behalf of a client request, with each worker's accounting: its in-flight count
(what the load-aware policy reads), request and error counters, circuit breaker, the upstream-error
metric, and a prompt health check after a transport error (`suspect`: control/health.py's).

Every prefill and decode call of the request path goes through `read` or `open`: the place for a
tracing span per upstream call.
"""

from __future__ import annotations

from collections.abc import Callable

from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.workers import WorkerState
from infer_ctl.router.http.jsonio import JSON_TYPE
from infer_ctl.router.http.upstream import Response, UpstreamError, Upstreams


class WorkerCalls:
    def __init__(self, upstreams: Upstreams, *, clock: Callable[[], float], metrics: RouterMetrics) -> None:
        self.upstreams = upstreams
        self.clock = clock
        self.metrics = metrics
        #: called with a worker that just failed at the transport level (the health checker checks it now;
        #: bound by router/daemon/assembly.py `_bind`: the health checker is built on the router)
        self.suspect: Callable[[WorkerState], None] = lambda w: None

    async def read(self, w: WorkerState, path: str, payload: bytes, headers: dict[str, str]) -> tuple[int, bytes, str]:
        """POST and read the whole answer: (status, body, content type). Raises UpstreamError."""
        w.inflight += 1
        w.requests += 1
        try:
            resp = await self.upstreams.request(w.url, "POST", path, payload, headers)
            try:
                data = await resp.read()
            finally:
                resp.close()
        except UpstreamError as exc:
            self.failed(w, "transport", str(exc))
            raise
        finally:
            w.inflight -= 1
        self.record(w, resp.status)
        return resp.status, data, resp.headers.get("content-type", JSON_TYPE)

    async def open(self, w: WorkerState, path: str, payload: bytes, headers: dict[str, str]) -> Response:
        """POST and return once the answer's head arrived; the worker counts as in flight until `done`."""
        w.inflight += 1
        w.requests += 1
        try:
            return await self.upstreams.request(w.url, "POST", path, payload, headers)
        except BaseException as exc:
            w.inflight -= 1
            if isinstance(exc, UpstreamError):
                self.failed(w, "transport", str(exc))
            raise

    @staticmethod
    def done(w: WorkerState, resp: Response) -> None:
        """The end of an `open`ed call, however it ended: a response read to its end gives its keep-alive
        connection back to the pool (a relayed stream, which `read` never saw), anything else closes it."""
        resp.release()
        w.inflight -= 1

    def record(self, w: WorkerState, status: int) -> None:
        """An answer arrived: 5xx counts against the worker's breaker, anything else for it."""
        ok = status < 500
        w.breaker.record(ok, self.clock())
        if not ok:
            w.errors += 1
            w.last_error = f"HTTP {status}"
            self.metrics.upstream_errors.labels(w.url, f"http_{status}").inc()

    def failed(self, w: WorkerState, kind: str, message: str) -> None:
        """No usable answer (transport error, broken or empty stream)."""
        w.errors += 1
        w.last_error = message
        w.breaker.record(False, self.clock())
        self.metrics.upstream_errors.labels(w.url, kind).inc()
        self.suspect(w)
