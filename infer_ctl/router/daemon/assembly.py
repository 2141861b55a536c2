"""The router's object graph, assembled in one place: every part is built here with its collaborators as
constructor arguments, in an order that gives each what it needs (docs/router.md, "Code map").

`role` says what this process is among the router's processes (router/daemon/procs.py, scaleout/follow.py):
None for the only one; a ProcessRole for one of several, which counts its load in the supervisor's shared
block and is the leader (index 0: the admin API, the snapshot's publisher) or a follower (applies the
leader's snapshot). Three links are cycles no construction order breaks; `_bind` makes them, once, at
the end of each build (see there).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from infer_ctl.core.routing.index import BLOCK_CHARS
from infer_ctl.router.config import (
    RouterConfig,
    coalesce_config,
    kv_routing,
    pair_floor,
    policy_config,
    prefix_index,
    prefix_registry,
)
from infer_ctl.router.control.admin import Admin
from infer_ctl.router.control.admin_prefixes import PrefixRoutes
from infer_ctl.router.control.admin_status import StatusRoutes, process_counters
from infer_ctl.router.control.admin_workers import WorkerChanges, WorkerRoutes
from infer_ctl.router.control.health import HealthChecker
from infer_ctl.router.control.warmer import PrefixWarmer
from infer_ctl.router.daemon.server import RouterServer
from infer_ctl.router.fleet import shared_flights
from infer_ctl.router.fleet.metrics import RouterMetrics
from infer_ctl.router.fleet.pair_health import PairTracker
from infer_ctl.router.fleet.shared_load import SharedLoad
from infer_ctl.router.fleet.workers import WorkerRegistry
from infer_ctl.router.http.h1 import H1Server
from infer_ctl.router.http.upstream import Upstreams
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.router.request.admission import Admission
from infer_ctl.router.request.attempt import AttemptRunner, StreamOpener
from infer_ctl.router.request.calls import WorkerCalls
from infer_ctl.router.request.coalesce import Coalescer
from infer_ctl.router.request.feedback import Feedback, TokenRatio
from infer_ctl.router.request.observe import observing
from infer_ctl.router.request.picker import PairPicker
from infer_ctl.router.request.proxy import Router, index_follows_ratio
from infer_ctl.router.request.recovery import StreamRecovery
from infer_ctl.router.request.relay import StreamRelay
from infer_ctl.router.scaleout.follow import Follower, ProcessRole, Publisher
from infer_ctl.router.scaleout.metrics_merge import ProcessMetrics
from infer_ctl.router.scaleout.replica_records import ReplicaRecords
from infer_ctl.router.scaleout.state_sync import StateSync


@dataclass(frozen=True)
class Seat:
    """This process's row in the shared block of several router processes: its in-flight load per
    worker, and (`flights`) its in-flight prefixes on the flight board (router/fleet/shared_flights.py)."""

    block: SharedLoad
    index: int
    processes: int
    flights: bool = True


def build(cfg: RouterConfig, role: ProcessRole | None = None, *, seat: Seat | None = None) -> RouterServer:
    """The router of this process: its request path, health checks, warmer, admin API and the state it
    shares with the other processes (`role`) or replicas (cfg.settings.state_store). `seat`: a shared block given
    directly (two routers of one test process stand for two processes); by default `role`'s."""
    cfg.validate()
    if seat is None and role is not None:
        seat = Seat(SharedLoad.attach(role.shm_name, role.processes, role.slots, extra=shared_flights.ROW_CELLS),
                    role.index, role.processes, cfg.settings.coalesce.processes)
    router = _router(cfg, seat, clock=time.monotonic, rng=random.Random())
    health = HealthChecker(router)
    warmer = PrefixWarmer(router)
    changes = WorkerChanges(router, health, warmer)
    #: with a state store, every change of named prefixes and workers goes through it to every replica
    replicas = StateSync(router, ReplicaRecords(router, apply_worker=changes.apply, on_prefix_change=warmer.poke),
                         url=cfg.settings.state_store, password=cfg.state_store_password,
                         namespace=cfg.state_namespace) if cfg.settings.state_store else None
    procs: Publisher | Follower | None = None
    process_metrics: ProcessMetrics | None = None
    if role is not None:
        process_metrics = ProcessMetrics(router.metrics.render, role.index, role.processes, role.metrics_file,
                                         lambda: router.metrics.answered, counters=lambda: process_counters(router))
        procs = (Publisher(router, role.snapshot) if role.leader
                 else Follower(router, role.snapshot, on_added=health.suspect))
    admin = Admin(router,
                  # the leader adds the other processes' counters to its own (the admin API runs there only)
                  status=StatusRoutes(router, replicas, process_metrics.peer_counters
                                      if process_metrics is not None and role is not None and role.leader else None),
                  workers=WorkerRoutes(router, changes, replicas), prefixes=PrefixRoutes(router, warmer, replicas),
                  on_change=procs.publish_now if isinstance(procs, Publisher) else None)
    server = RouterServer(cfg, router=router, health=health, warmer=warmer, admin=admin, replicas=replicas,
                          role=role, procs=procs, shared=seat.block if role is not None and seat is not None else None,
                          process_metrics=process_metrics)
    _bind(router, server.http, health)
    return server


def build_router(cfg: RouterConfig, *, seat: Seat | None = None, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> Router:
    """The request path alone, without an HTTP front (tests, benchmarks)."""
    router = _router(cfg, seat, clock=clock, rng=rng or random.Random())
    _bind(router, None, None)
    return router


def _router(cfg: RouterConfig, seat: Seat | None, *, clock: Callable[[], float], rng: random.Random) -> Router:
    workers = WorkerRegistry(cfg, *((seat.block, seat.index) if seat is not None else ()))
    index = prefix_index(cfg.settings)
    prefixes = prefix_registry(cfg.settings)  # (config.py: shared placement with replicas, pins by touch)
    now = clock()
    for p in cfg.prefixes:
        prefixes.register(p.name, p.text, now=now, ttl_s=p.ttl_s, replicas=p.replicas, pin=p.pin, fmt=p.fmt,
                          keep=p.keep)
    policy = policy_config(cfg.settings)
    upstreams = Upstreams()
    admission = Admission(cfg.settings.max_concurrent, cfg.settings.max_queue, cfg.settings.queue_timeout_s)
    metrics = RouterMetrics()
    pairs = PairTracker(pair_floor(cfg.settings), clock)
    spec = SpecStats(window=cfg.spec_window_requests, max_labels=cfg.settings.spec_max_labels, clock=clock)
    ratio = TokenRatio(on_change=index_follows_ratio(workers, index))
    # the exact index from the prefills' KV events; the predicted index stays the fallback for every
    # worker whose stream is not trusted
    kv = kv_routing(cfg, metrics=metrics, chars_per_token=ratio.get,
                    processes=seat.processes if seat is not None else 1)
    # in-flight prefix coalescing: the pending overlay the picker reads, and the hold; with several
    # processes sharing their flights, every process's on the board
    coalescing = cfg.settings.coalesce.enabled and cfg.settings.policy == "cache_aware"
    board = None
    if coalescing and seat is not None and seat.flights:
        board = shared_flights.FlightBoard(seat.block.cells, seat.block.extra_offset, seat.processes, seat.index,
                                           workers.url_of_slot, workers.slot_of)
    coalesce = Coalescer(coalesce_config(cfg.settings), block_chars=BLOCK_CHARS, chars_per_token=ratio.get,
                         registry=metrics.registry, max_retries=cfg.settings.max_retries, kv=kv if coalescing else None,
                         board=board)
    picker = PairPicker(workers, index, policy, rng=rng, clock=clock, metrics=metrics, pairs=pairs, kv=kv,
                        pending=coalesce.pending if coalescing else None,
                        sync_pending=coalesce.sync if board is not None else None,
                        long_chars=cfg.settings.kv_events.anchor_max_chars)
    calls = WorkerCalls(upstreams, clock=clock, metrics=metrics)
    feedback = Feedback(prefixes, ratio=ratio, clock=clock, metrics=metrics, log_requests=cfg.settings.log_requests,
                        spec=spec, index=index, kv=kv)
    opener = StreamOpener(calls, request_timeout_s=cfg.settings.request_timeout_s,
                          early_head=cfg.settings.stream_head == "early")
    recovery = StreamRecovery(enabled=cfg.settings.stream_recovery, pick=picker.pick, open_stream=opener.open_stream,
                              upstreams=upstreams, rng=rng, metrics=metrics, max_tries=1 + cfg.settings.max_retries,
                              linger=opener.finish_later)
    relay = StreamRelay(calls, feedback, clock=clock, metrics=metrics, recovery=recovery)
    attempts = AttemptRunner(calls, relay, feedback, opener, rng=rng)
    return Router(cfg, clock=clock, rng=rng, workers=workers, index=index, prefixes=prefixes, policy=policy,
                  upstreams=upstreams, admission=admission, metrics=metrics, pairs=pairs, picker=picker, calls=calls,
                  spec=spec, ratio=ratio, feedback=feedback, kv=kv, coalesce=coalesce, attempts=attempts,
                  # tracing and tenants; None with neither configured
                  observing=observing(cfg, clock=clock, registry=metrics.registry, workers=workers,
                                      chars_per_token=ratio.get, spec=spec, pairs=pairs))


def _bind(router: Router, front: H1Server | None, health: HealthChecker | None) -> None:
    """The links that are cycles, made once the parts exist:
    - the metrics' scrape-time gauges read the router's parts (workers, index, exact index, ...), and
      every part counts into the metrics, so the gauges are added last; with them, the front's
      connections (the front's requests go to the router);
    - the exact index tells the coalescer of each applied batch (a held request's leader may have
      landed), and the coalescer reads the exact index;
    - a worker that fails a request's call at the transport level is checked at once by the health
      checker, which is built on the router (whose calls those are)."""
    router.metrics.watch(router, (lambda: (len(front.conns), front.refused)) if front is not None else None)
    if router.picker.pending is not None:
        router.kv.on_batch = router.coalesce.kv_batch
    if health is not None:
        router.calls.suspect = health.suspect
