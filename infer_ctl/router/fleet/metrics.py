"""Prometheus metrics of one router instance (its own registry: no process-global state).

Hot-path counters and histograms are prometheus_client objects; gauges that mirror router state
(per-worker in-flight/health/breaker, named prefixes, index size) are read at scrape time by a custom
collector, so the request path never updates them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infer_ctl.core.routing.index import PrefixIndex
from infer_ctl.core.routing.prefixes import PrefixRegistry
from infer_ctl.router.fleet.pair_health import PairTracker
from infer_ctl.router.fleet.workers import WorkerRegistry
from infer_ctl.router.kvindex.kv_routing import KvRouting
from infer_ctl.router.observe.spec_stats import SpecStats
from infer_ctl.router.observe.temperature import BANDS

_LAT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: SGLang's "GB" of kv_transfer_speed_gb_s (total MiB / 1024)
_GIB = 2**30
_FAST = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.01)


class RouterState(Protocol):
    """What the scrape-time gauges read. proxy.Router provides it; naming the protocol here instead of
    the class keeps this module free of proxy.py, which imports it."""

    @property
    def workers(self) -> WorkerRegistry: ...
    @property
    def index(self) -> PrefixIndex: ...
    @property
    def prefixes(self) -> PrefixRegistry: ...
    @property
    def active(self) -> int: ...
    @property
    def spec(self) -> SpecStats: ...
    @property
    def kv(self) -> KvRouting: ...
    @property
    def pairs(self) -> PairTracker: ...


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("inferctl_router_requests_total", "Requests answered, by endpoint and HTTP status",
                                ["endpoint", "status"], registry=r)
        self.duration = Histogram("inferctl_router_request_duration_seconds", "Request latency at the router",
                                  ["endpoint"], buckets=_LAT, registry=r)
        self.ttft = Histogram("inferctl_router_ttft_seconds", "Router-measured time to first streamed chunk",
                              buckets=_LAT, registry=r)
        self.itl = Histogram("inferctl_router_itl_seconds", "Router-measured gap between streamed chunks",
                             buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0), registry=r)
        self.decision = Histogram("inferctl_router_routing_decision_seconds", "Time to choose the worker(s)",
                                  buckets=_FAST, registry=r)
        self.decisions = Counter("inferctl_router_routing_decisions_total", "Routing decisions by reason",
                                 ["reason"], registry=r)
        self.retries = Counter("inferctl_router_retries_total", "Retries on a new worker pair, by cause",
                               ["cause"], registry=r)
        self.upstream_errors = Counter("inferctl_router_upstream_errors_total", "Failed upstream calls",
                                       ["worker", "kind"], registry=r)
        self.rejected = Counter("inferctl_router_rejected_total", "Requests refused by the router itself",
                                ["reason"], registry=r)
        self.predicted_tokens = Counter("inferctl_router_cache_predicted_tokens_total",
                                        "Prompt tokens the router predicted to be cached where it routed", registry=r)
        self.actual_tokens = Counter("inferctl_router_cache_actual_tokens_total",
                                     "Cached prompt tokens the workers reported (cached_tokens)", registry=r)
        self.prompt_tokens = Counter("inferctl_router_prompt_tokens_total", "Prompt tokens the workers reported",
                                     registry=r)
        # output tokens/s with or without tenants (inferctl_tenant_output_tokens_total exists only with them)
        self.output_tokens = Counter("inferctl_router_output_tokens_total",
                                     "Completion (output) tokens the workers reported", registry=r)
        self.stream_errors = Counter("inferctl_router_stream_errors_total",
                                     "Streams ended with an error event after the first byte", registry=r)
        self.recoveries = Counter("inferctl_router_stream_recoveries_total",
                                  "Streams broken after their first byte, by how mid-stream recovery ended: resumed "
                                  "(continued on another pair), not_continuable (not exactly: error event), failed "
                                  "(no pair could continue it: error event)", ["outcome"], registry=r)
        self.spec_actions = Counter("inferctl_router_spec_actions_total",
                                    "Speculative-decoding controller actions (advise, relaunch, restore) by pool",
                                    ["pool", "action"], registry=r)
        self.pd_actions = Counter("inferctl_router_pd_actions_total",
                                  "Prefill:decode balance controller actions (advise, switch, cover, restore, "
                                  "failed) by the role the server moved to", ["action", "to_role"], registry=r)
        self.kv_events = Counter("inferctl_router_kv_events_total", "KV events applied (SGLang's BlockStored, "
                                 "BlockRemoved, AllBlocksCleared), by worker", ["worker"], registry=r)
        self.kv_batches = Counter("inferctl_router_kv_batches_total", "KV event batches applied, by worker",
                                  ["worker"], registry=r)
        self.kv_gaps = Counter("inferctl_router_kv_gaps_total", "Sequence gaps in a worker's KV event stream",
                               ["worker"], registry=r)
        self.kv_replays = Counter("inferctl_router_kv_replays_total",
                                  "Replays asked of a worker's replay socket, by result (ok, failed)",
                                  ["worker", "result"], registry=r)
        self.kv_rejected = Counter("inferctl_router_kv_rejected_total",
                                   "KV event batches refused (decode, malformed, unknown_event, oversized, orphan, "
                                   "capacity, flood, ...)", ["worker", "kind"], registry=r)
        self.kv_untrusted = Counter("inferctl_router_kv_untrusted_total",
                                    "Times a worker's KV event stream became untrusted", ["worker"], registry=r)
        self.kv_refused = Counter("inferctl_router_kv_blocks_refused_total",
                                  "KV event blocks in batches refused for passing a medium's bound "
                                  "(kv_events.max_blocks_per_medium)", ["worker", "medium"], registry=r)
        self.kv_restarts = Counter("inferctl_router_kv_restarts_total",
                                   "Publisher restarts seen on a worker's KV event stream", ["worker"], registry=r)
        #: (open, refused) client connections of the HTTP front (`watch`; 0s without a front)
        self.connections: Callable[[], tuple[int, int]] | None = None
        # labelled children looked up once: .labels() costs a lock and a dict build per call
        self._req_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._decision_children: dict[str, Any] = {}
        #: requests answered so far (a plain int: the multi-process metrics writer skips rendering
        #: while it does not move, router/scaleout/metrics_merge.py)
        self.answered = 0

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        pair = self._req_children.get((endpoint, status))
        if pair is None:
            pair = self._req_children[(endpoint, status)] = (
                self.requests.labels(endpoint, str(status)), self.duration.labels(endpoint))
        pair[0].inc()
        pair[1].observe(seconds)
        self.answered += 1

    def observe_decision(self, reason: str, seconds: float) -> None:
        child = self._decision_children.get(reason)
        if child is None:
            child = self._decision_children[reason] = self.decisions.labels(reason)
        child.inc()
        self.decision.observe(seconds)

    def kv_event(self, worker: str, what: str, n: int) -> None:
        """A KV event stream's counter (router/kvindex/kv_subscriber.py `on_event`)."""
        if what == "events":
            self.kv_events.labels(worker).inc(n)
        elif what == "batches":
            self.kv_batches.labels(worker).inc(n)
        elif what == "gap":
            self.kv_gaps.labels(worker).inc(n)
        elif what in ("replay_ok", "replay_failed"):
            self.kv_replays.labels(worker, what[7:]).inc(n)
        elif what == "untrusted":
            self.kv_untrusted.labels(worker).inc(n)
        elif what == "restart":
            self.kv_restarts.labels(worker).inc(n)
        elif what.startswith("rejected:"):
            self.kv_rejected.labels(worker, what[9:]).inc(n)
        elif what.startswith("refused:"):
            self.kv_refused.labels(worker, what[8:]).inc(n)

    def watch(self, router: RouterState, connections: Callable[[], tuple[int, int]] | None = None) -> None:
        """The scrape-time gauges: they read the router's parts, each of which counts into this object,
        so they are added once the router exists (router/daemon/assembly.py `_bind`, its only caller)."""
        self.connections = connections
        r = self.registry
        r.register(_ConnectionCollector(self))
        r.register(_StateCollector(router))
        r.register(_SpecCollector(router))
        r.register(_PairCollector(router))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, router: RouterState) -> None:
        self.router = router

    def describe(self) -> list[Metric]:
        return []  # dynamic label sets: nothing to pre-register

    def collect(self) -> Iterator[Metric]:
        router = self.router
        inflight = GaugeMetricFamily("inferctl_router_worker_inflight", "Requests in flight per worker",
                                     labels=["worker", "role"])
        healthy = GaugeMetricFamily("inferctl_router_worker_healthy", "1 if the worker passes health checks",
                                    labels=["worker", "role"])
        cb = GaugeMetricFamily("inferctl_router_worker_cb_state",
                               "Circuit breaker: 0 closed, 1 open, 2 half-open", labels=["worker"])
        # flap damping (router/control/health.py): the hold-down chosen at the last ejection (0 once let back),
        # not what is left of it (/admin/workers `holddown_left_s`): the collector reads no clock
        holddown = GaugeMetricFamily("inferctl_router_worker_holddown_seconds",
                                     "Hold-down the unhealthy worker must answer its checks for before it is let "
                                     "back (flap damping; 0: none)", labels=["worker", "role"])
        ejections = CounterMetricFamily("inferctl_router_worker_ejections",
                                        "Times the worker went out: unhealthy, or found restarted between two "
                                        "checks (router/control/health.py)", labels=["worker", "role"])
        for w in router.workers.all():
            inflight.add_metric([w.url, w.role], w.load_inflight)
            healthy.add_metric([w.url, w.role], 1 if w.healthy else 0)
            cb.add_metric([w.url], w.breaker.state.gauge)
            holddown.add_metric([w.url, w.role], w.flap.holddown_s)
            ejections.add_metric([w.url, w.role], w.flap.ejections)
        yield from (inflight, healthy, cb, holddown, ejections)
        yield GaugeMetricFamily("inferctl_router_active_requests", "Requests being handled", value=router.active)
        yield GaugeMetricFamily("inferctl_router_index_blocks", "Entries in the prefix index", value=len(router.index))
        state = GaugeMetricFamily("inferctl_router_prefix_active", "1 if the named prefix version is active",
                                  labels=["prefix", "version"])
        warm = GaugeMetricFamily("inferctl_router_prefix_warm_replicas", "Warm replicas of the named prefix",
                                 labels=["prefix"])
        reqs = GaugeMetricFamily("inferctl_router_prefix_requests", "Requests matched to the named prefix",
                                 labels=["prefix"])
        pred = GaugeMetricFamily("inferctl_router_prefix_predicted_cached_tokens",
                                 "Predicted cached tokens of the named prefix's traffic", labels=["prefix"])
        act = GaugeMetricFamily("inferctl_router_prefix_actual_cached_tokens",
                                "Reported cached tokens of the named prefix's traffic", labels=["prefix"])
        hit = GaugeMetricFamily("inferctl_router_prefix_hit_rate",
                                "Share of the named prefix's requests served with the prefix cached", labels=["prefix"])
        for rec in router.prefixes.records():
            state.add_metric([rec.name, str(rec.version)], 1 if rec.state.value == "active" else 0)
            if rec.state.value == "active":
                warm.add_metric([rec.name], len(rec.warm_replicas()))
                reqs.add_metric([rec.name], rec.stats.requests)
                pred.add_metric([rec.name], rec.stats.predicted_tokens)
                act.add_metric([rec.name], rec.stats.actual_cached_tokens)
                hit.add_metric([rec.name], rec.stats.hit_rate)
        yield from (state, warm, reqs, pred, act, hit)
        kv_state = GaugeMetricFamily("inferctl_router_kv_index_state",
                                     "1 for the index a prefill is routed on (exact, replaying, predicted)",
                                     labels=["worker", "state"])
        kv_blocks = GaugeMetricFamily("inferctl_router_kv_blocks", "Blocks the worker's KV events say it holds",
                                      labels=["worker"])
        by_medium = GaugeMetricFamily("inferctl_router_kv_blocks_by_medium",
                                      "Blocks the worker's KV event streams hold per storage medium (a page in "
                                      "HBM and host memory counts on each)", labels=["worker", "medium"])
        untrusted = 0
        for url, wkv in router.kv.workers.items():
            media: dict[str, int] = {}
            for s in wkv.streams:
                for m, n in s.blocks.snapshot().items():
                    media[m] = media.get(m, 0) + n
            for m, n in sorted(media.items()):
                by_medium.add_metric([url, m], n)
            st = wkv.state
            kv_state.add_metric([url, "exact" if st == "exact" else st if st == "replaying" else "predicted"], 1)
            kv_blocks.add_metric([url], sum(len(s.blocks) for s in wkv.streams))
            untrusted += sum(s.state == "untrusted" for s in wkv.streams)
        yield kv_state
        yield kv_blocks
        yield by_medium
        yield GaugeMetricFamily("inferctl_router_kv_untrusted_streams", "KV event streams not trusted now",
                                value=untrusted)


class _ConnectionCollector(Collector):
    """The connection cap (router.max_connections, http/h1.py): read at scrape time from the front."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        read = self.metrics.connections
        open_, refused = read() if read is not None else (0, 0)
        yield GaugeMetricFamily("inferctl_router_connections_open", "Client connections open (the cap counts "
                                "these; refused ones are not)", value=open_)
        yield CounterMetricFamily("inferctl_router_connections_refused", "Client connections answered 503 and "
                                  "closed because router.max_connections were open", value=refused)


class _PairCollector(Collector):
    """Pair health (router/fleet/pair_health.py): degraded pairs and the last KV transfer attributed to each."""

    def __init__(self, router: RouterState) -> None:
        self.router = router

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        tracker = self.router.pairs
        degraded = GaugeMetricFamily("inferctl_router_pair_degraded",
                                     "1 while the router avoids the prefill x decode pair, by reason",
                                     labels=["prefill", "decode", "reason"])
        # in base units (promtool check metrics): SGLang reports GB/s as MiB/1024 per second (GiB/s,
        # observability/req_time_stats.py) and milliseconds
        speed = GaugeMetricFamily("inferctl_router_pair_kv_transfer_bytes_per_second",
                                  "Last KV transfer speed SGLang reported for the pair", labels=["prefill", "decode"])
        latency = GaugeMetricFamily("inferctl_router_pair_kv_transfer_latency_seconds",
                                    "Last KV transfer latency SGLang reported for the pair", labels=["prefill", "decode"])
        failed = CounterMetricFamily("inferctl_router_pair_kv_transfers_failed",
                                     "Requests whose KV transfer failed on the pair", labels=["prefill", "decode"])
        for st in tracker.health.pairs.values():
            labels = [st.prefill, st.decode]
            if st.reason is not None:
                degraded.add_metric([*labels, st.reason], 1)
            if st.speed_gb_s is not None:
                speed.add_metric(labels, st.speed_gb_s * _GIB)
            if st.latency_ms is not None:
                latency.add_metric(labels, st.latency_ms / 1000)
            failed.add_metric(labels, st.transfers_failed)
        yield from (degraded, speed, latency, failed)
        yield CounterMetricFamily("inferctl_router_pair_avoided", "Routing decisions that left out a degraded pair",
                                  value=tracker.avoided)
        yield CounterMetricFamily("inferctl_router_pair_fallbacks",
                                  "Routing decisions with every pair of the prefill degraded (one used anyway)",
                                  value=tracker.fallbacks)


class _SpecCollector(Collector):
    """Acceptance per decode and workload label over the rolling window (router/observe/spec_stats.py)."""

    def __init__(self, router: RouterState) -> None:
        self.router = router

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["decode", "label"]
        rate = GaugeMetricFamily("inferctl_router_spec_accept_rate",
                                 "Correct / proposed drafts over the window (SGLang's spec_accept_rate)", labels=labels)
        length = GaugeMetricFamily("inferctl_router_spec_accept_length",
                                   "Completion tokens / verify steps over the window (SGLang's spec_accept_length)",
                                   labels=labels)
        alpha = GaugeMetricFamily("inferctl_router_spec_alpha",
                                  "Estimated per-draft acceptance probability over the window", labels=labels)
        ema = GaugeMetricFamily("inferctl_router_spec_alpha_ema",
                                "Estimated per-draft acceptance probability, exponentially weighted", labels=labels)
        reqs = GaugeMetricFamily("inferctl_router_spec_window_requests", "Requests in the window", labels=labels)
        steps = GaugeMetricFamily("inferctl_router_spec_num_steps",
                                  "The decode's live speculative step count (/server_info internal_states)",
                                  labels=["decode", "target", "draft"])
        # every answer of a speculative decode by its request's temperature band (observe/temperature.py)
        bands = CounterMetricFamily("inferctl_router_spec_requests",
                                    "Requests answered by a speculative decode, by sampling temperature band",
                                    labels=["decode", "temperature_band"])
        for d in self.router.spec.decodes.values():
            for band, n in zip(BANDS, d.temperature.totals, strict=True):
                if n:
                    bands.add_metric([d.url, band], n)
            if d.num_steps is not None:
                steps.add_metric([d.url, d.target or "", d.draft or ""], d.num_steps)
            for name, roll in (("all", d.overall), *d.labels.items()):
                r = roll.as_dict()
                key = [d.url, name]
                reqs.add_metric(key, r["window"]["requests"])
                for fam, value in ((rate, r["window"]["accept_rate"]), (length, r["window"]["accept_length"]),
                                   (alpha, r["window"]["alpha"]), (ema, r["ema"]["alpha"])):
                    if value is not None:
                        fam.add_metric(key, value)
        yield from (rate, length, alpha, ema, reqs, steps, bands)


def histogram_totals(h: Histogram) -> tuple[float, int]:
    """An unlabelled histogram's sum and count (pd control's window: GET /admin/pd)."""
    total, count = 0.0, 0
    for metric in h.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                total = float(sample.value)
            elif sample.name.endswith("_count"):
                count = int(sample.value)
    return total, count


def counter_value(c: Counter) -> float:
    """An unlabelled counter's value."""
    return next((float(s.value) for m in c.collect() for s in m.samples if s.name.endswith("_total")), 0.0)
