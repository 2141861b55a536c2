"""Many simulated workers in one process: the asyncio API and a thread-hosted one for sync callers.

cluster = await start_cluster([WorkerSpec("prefill"), WorkerSpec("decode")])
cluster.urls; cluster.workers[0].bootstrap_port; await cluster.stop_worker(1); await cluster.start_worker(1)

threaded = start_cluster_in_thread(specs)   # own event loop in a daemon thread
threaded.urls; threaded.stop_worker(1); threaded.start_worker(1); threaded.stop()
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Coroutine
from typing import Any, TypeVar

from infer_ctl.aio import LoopThread
from infer_ctl.sim.config import WorkerSpec
from infer_ctl.sim.server import SimWorker

__all__ = [
    "SimCluster",
    "SimWorker",
    "ThreadedSimCluster",
    "WorkerSpec",
    "start_cluster",
    "start_cluster_in_thread",
]

T = TypeVar("T")


class SimCluster:
    def __init__(self, workers: list[SimWorker]) -> None:
        self.workers = workers

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    def by_role(self, role: str) -> list[SimWorker]:
        return [w for w in self.workers if w.spec.role == role]

    async def stop_worker(self, i: int) -> None:
        """Stop worker i (its HTTP and bootstrap ports close; in-flight requests are aborted)."""
        await self.workers[i].stop()

    async def start_worker(self, i: int) -> None:
        """Restart worker i on the same port(s) with a fresh cache and a new /server_info start time."""
        old = self.workers[i]
        spec = dataclasses.replace(old.spec, port=old.port)
        if spec.role == "prefill" or (spec.enable_pd_role_switch and spec.role != "mixed"):
            spec.bootstrap_port = old.bootstrap_port  # every role-switch PD worker has a bootstrap server
        if old.ready:
            await old.stop()
        worker = SimWorker(spec)
        await worker.start()
        self.workers[i] = worker

    async def add_worker(self, spec: WorkerSpec) -> SimWorker:
        worker = SimWorker(spec)
        await worker.start()
        self.workers.append(worker)
        return worker

    async def stop(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)


async def start_cluster(specs: list[WorkerSpec], *, port_fallback: bool = False) -> SimCluster:
    """Start every worker; `port_fallback` moves a worker whose fixed port is busy to a free port."""
    workers = [SimWorker(s, port_fallback=port_fallback) for s in specs]
    started: list[SimWorker] = []
    try:
        for w in workers:
            await w.start()
            started.append(w)
    except BaseException:
        await asyncio.gather(*(w.stop() for w in started), return_exceptions=True)
        raise
    return SimCluster(workers)


class ThreadedSimCluster:
    """A SimCluster whose event loop runs in a daemon thread; every method is synchronous."""

    def __init__(self, specs: list[WorkerSpec], timeout: float = 30.0, *, port_fallback: bool = False) -> None:
        self._runner = LoopThread("inferctl-sim", timeout)
        self.loop = self._runner.loop
        try:
            self.cluster = self._call(start_cluster(specs, port_fallback=port_fallback))
        except BaseException:
            self._runner.close()
            raise

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the cluster's loop (e.g. `call(cluster.cluster.add_worker(spec))`)."""
        return self._call(coro)

    def by_role(self, role: str) -> list[SimWorker]:
        return self.cluster.by_role(role)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.call(coro)

    @property
    def workers(self) -> list[SimWorker]:
        return self.cluster.workers

    @property
    def urls(self) -> list[str]:
        return self.cluster.urls

    def stop_worker(self, i: int) -> None:
        self._call(self.cluster.stop_worker(i))

    def start_worker(self, i: int) -> None:
        self._call(self.cluster.start_worker(i))

    def stop(self) -> None:
        if self._runner.closed:
            return
        try:
            self._call(self.cluster.stop())
        finally:
            self._runner.close()

    def __enter__(self) -> ThreadedSimCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_cluster_in_thread(specs: list[WorkerSpec], *, port_fallback: bool = False) -> ThreadedSimCluster:
    return ThreadedSimCluster(specs, port_fallback=port_fallback)
