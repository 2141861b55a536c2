"""Per-worker metrics with SGLang's Prometheus names (`observability/metrics_collector.py`). Pure.

Only what the simulator can honestly produce is exported; all latencies are in model seconds.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from infer_ctl.core.promtext import escape_label_value, format_value

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


@dataclass
class Histogram:
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += value
        self.n += 1


#: SGLang's KV transfer histograms (metrics_collector.py, registered on PD workers)
KV_LATENCY_MS_BUCKETS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)
KV_SPEED_GB_S_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)


@dataclass
class WorkerMetrics:
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    num_requests: int = 0
    num_aborted: int = 0
    bootstrap_failed: int = 0
    transfer_failed: int = 0
    #: sglang:spec_verify_calls_total: each finished request adds its spec_verify_ct
    spec_verify_calls: int = 0
    #: the speculative gauges, set every decode_log_interval decode batches from that interval only
    #: (SGLang's metrics_reporter.report_decode_stats; `spec_decode.SpecDecoder` sets them)
    spec_accept_length: float = 0.0
    spec_accept_rate: float = 0.0
    spec_num_steps: int = 0
    spec_num_draft_tokens: int = 0
    #: accepted tokens (drafts + bonus) and request-steps of the completed intervals since start: the
    #: /v1/loads accept_length and /server_info avg_spec_accept_length
    spec_total_accept_tokens: int = 0
    spec_total_forward_ct: int = 0
    #: the last finished transfer's (a prefill's /v1/loads disaggregation section)
    kv_transfer_latency_ms: float = 0.0
    kv_transfer_speed_gb_s: float = 0.0
    #: every finished transfer: SGLang's /metrics exports these as histograms, not gauges
    kv_transfer_latency: Histogram = field(default_factory=lambda: Histogram(KV_LATENCY_MS_BUCKETS))
    kv_transfer_speed: Histogram = field(default_factory=lambda: Histogram(KV_SPEED_GB_S_BUCKETS))

    def observe_transfer(self, latency_ms: float, speed_gb_s: float) -> None:
        self.kv_transfer_latency_ms, self.kv_transfer_speed_gb_s = latency_ms, speed_gb_s
        self.kv_transfer_latency.observe(latency_ms)
        self.kv_transfer_speed.observe(speed_gb_s)

    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def spec_avg_accept_length(self) -> float | None:
        """None until the first interval completed (SGLang then omits the field)."""
        if not self.spec_total_forward_ct:
            return None
        return self.spec_total_accept_tokens / self.spec_total_forward_ct


#: SGLang 0.5.23's own help texts (observability/metrics_collector.py, SchedulerMetricsCollector)
GAUGE_HELP = {
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
    "spec_accept_rate": "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
    "spec_num_steps": "Currently active speculative_num_steps.",
    "spec_num_draft_tokens": "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
}


def render(m: WorkerMetrics, labels: dict[str, str], gauges: dict[str, float],
           counters: dict[str, float] | None = None, pd: bool = False) -> str:
    """Prometheus text for one worker. `gauges` maps metric suffix -> value (load, cache, PD queues),
    `counters` likewise for counters kept elsewhere (the cache's evictions); `pd`: a PD worker's KV
    transfer histograms (SGLang registers them in PD mode only)."""
    lab = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels.items())
    out: list[str] = []

    def family(name: str, kind: str, help_: str) -> None:
        out.append(f"# HELP sglang:{name} {help_}")
        out.append(f"# TYPE sglang:{name} {kind}")

    def hist(name: str, h: Histogram, help_: str) -> None:
        family(name, "histogram", help_)
        cumulative = 0
        for bound, count in zip(h.buckets, h.counts, strict=True):
            cumulative += count
            out.append(f'sglang:{name}_bucket{{{lab},le="{format_value(bound)}"}} {cumulative}')
        out.append(f'sglang:{name}_bucket{{{lab},le="+Inf"}} {h.n}')
        out.append(f"sglang:{name}_sum{{{lab}}} {format_value(h.total)}")
        out.append(f"sglang:{name}_count{{{lab}}} {h.n}")

    hist("time_to_first_token_seconds", m.ttft, "Histogram of time to first token in seconds.")
    hist("inter_token_latency_seconds", m.itl, "Histogram of inter-token latency in seconds.")
    hist("e2e_request_latency_seconds", m.e2e, "Histogram of End-to-end request latency in seconds")
    hist("queue_time_seconds", m.queue_time, "Histogram of queueing time in seconds.")
    if pd:
        hist("kv_transfer_latency_ms", m.kv_transfer_latency, "Histogram of KV cache transfer latency in ms.")
        hist("kv_transfer_speed_gb_s", m.kv_transfer_speed, "Histogram of KV cache transfer speed in GB/s.")
    all_counters = {
        "prompt_tokens_total": (m.prompt_tokens, "Number of prefill tokens processed."),
        "generation_tokens_total": (m.generation_tokens, "Number of generation tokens processed."),
        "cached_tokens_total": (m.cached_tokens, "Number of cached prompt tokens."),
        "num_requests_total": (m.num_requests, "Number of requests processed."),
        "num_aborted_requests_total": (m.num_aborted, "Number of requests aborted."),
        "num_bootstrap_failed_reqs_total": (m.bootstrap_failed, "Number of bootstrap failed requests."),
        "num_transfer_failed_reqs_total": (m.transfer_failed, "Number of transfer failed requests."),
        "spec_verify_calls_total": (m.spec_verify_calls, "Number of speculative decoding verification calls."),
        **{name: (value, f"The {name.replace('_', ' ')}.") for name, value in (counters or {}).items()},
    }
    for name, (count, help_) in all_counters.items():
        family(name, "counter", help_)
        out.append(f"sglang:{name}{{{lab}}} {format_value(count)}")
    all_gauges: dict[str, float] = {
        "cache_hit_rate": m.cache_hit_rate,
        "spec_accept_length": m.spec_accept_length,
        "spec_accept_rate": m.spec_accept_rate,
        "spec_num_steps": m.spec_num_steps,
        "spec_num_draft_tokens": m.spec_num_draft_tokens,
        **gauges,
    }
    for name, value in all_gauges.items():
        family(name, "gauge", GAUGE_HELP.get(name, f"The {name.replace('_', ' ')}."))
        out.append(f"sglang:{name}{{{lab}}} {format_value(value)}")
    return "\n".join(out) + "\n"
