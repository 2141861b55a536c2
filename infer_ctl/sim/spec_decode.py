"""Speculative decoding on one worker's decode loop, as SGLang 0.5.23 runs and counts it. No asyncio.

Per decode batch the engine asks `steps_for_batch` how many draft steps to run (the launch
`--speculative-num-steps`, or the adaptive controller's choice for this batch size), charges
(1 + steps x c) target steps for it (`TimingModel.decode_step_seconds`), draws each request's accepted
drafts with `draw` (its domain's alpha now, `SpecWorkload.alpha`; chain drafts: each accepted with
probability alpha until the first rejection) and hands the batch's counts to `verify_done`.

Counting follows SGLang: per request `spec_verify_ct`, accepted drafts and the histogram come from the
verify result (untrimmed: a run cut short by max_new_tokens still counts what the verify accepted,
`scheduler_components/batch_result_processor.py`); the gauges are recomputed every
`decode_log_interval` decode batches from that interval (`metrics_reporter.report_decode_stats`), whose
totals then feed `/v1/loads` and `avg_spec_accept_length`.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Protocol

from infer_ctl.sim.metrics import WorkerMetrics
from infer_ctl.sim.spec_adaptive import AdaptiveSpeculativeParams
from infer_ctl.sim.spec_workload import SpecWorkload
from infer_ctl.sim.timing import TimingModel, draw_accepted

if TYPE_CHECKING:
    from infer_ctl.sim.config import WorkerSpec

#: SGLang's --decode-log-interval default
DECODE_LOG_INTERVAL = 40


class SpecRequest(Protocol):
    """What the decoder reads and counts on a request (`engine.SimRequest` is one)."""

    rng: random.Random
    domain: str
    verify_ct: int
    accepted_drafts: int
    spec_histogram: list[int]
    output_ids: list[int]


class SpecDecoder:
    def __init__(
        self,
        timing: TimingModel,
        workload: SpecWorkload,
        metrics: WorkerMetrics,
        *,
        time_scale: float,
        adaptive: AdaptiveSpeculativeParams | None = None,
        decode_log_interval: int = DECODE_LOG_INTERVAL,
    ) -> None:
        if timing.spec_alpha is None:
            raise ValueError("speculative decoding is off in this timing model")
        if decode_log_interval < 1:
            raise ValueError(f"decode_log_interval must be >= 1, got {decode_log_interval}")
        self.base_alpha: float = timing.spec_alpha
        self.launch_steps = timing.spec_gamma
        self.workload = workload
        self.metrics = metrics
        self.time_scale = time_scale
        self.adaptive = adaptive
        self.decode_log_interval = decode_log_interval
        #: the step count the last batch ran (SGLang's draft worker speculative_num_steps)
        self.current_steps = self.launch_steps
        self.forward_ct_decode = 0
        self._win_accept_tokens = 0
        self._win_correct = 0
        self._win_forward = 0
        workload.start()

    @property
    def current_draft_tokens(self) -> int:
        return self.current_steps + 1  # topk 1: a chain of steps drafts plus the verified root

    def steps_for_batch(self, batch_size: int) -> int:
        if self.adaptive is not None:
            self.current_steps = self.adaptive.steps_for_batch(batch_size)
        return self.current_steps

    def domain_of(self, label: str | None) -> str:
        return self.workload.resolve(label)

    def alpha_now(self, domain: str, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        return self.workload.alpha(domain, self.base_alpha, now, self.time_scale)

    def draw(self, req: SpecRequest, steps: int, now: float | None = None) -> int:
        """One verify of `req` with `steps` drafts: the drafts it accepted (the verify result)."""
        accepted = draw_accepted(req.rng, self.alpha_now(req.domain, now), steps) if steps > 0 else 0
        req.verify_ct += 1
        req.accepted_drafts += accepted
        h = req.spec_histogram
        if accepted >= len(h):
            h.extend([0] * (accepted + 1 - len(h)))
        h[accepted] += 1
        return accepted

    def verify_done(self, correct_per_req: list[int]) -> None:
        """After one decode batch's verify: interval counters, the adaptive controller, the gauges."""
        bs = len(correct_per_req)
        self._win_correct += sum(correct_per_req)
        self._win_accept_tokens += sum(correct_per_req) + bs
        self._win_forward += bs
        if self.adaptive is not None:
            switched = self.adaptive.on_verify_complete(correct_per_req, bs)
            if switched is not None:  # AdaptiveController._activate: the worker switches at once
                self.current_steps = switched
        self.forward_ct_decode += 1
        if self.forward_ct_decode % self.decode_log_interval == 0:
            self._publish()

    def _publish(self) -> None:
        m = self.metrics
        if self._win_forward:
            m.spec_accept_length = self._win_accept_tokens / self._win_forward
            proposed = self._win_forward * (self.current_draft_tokens - 1)
            m.spec_accept_rate = self._win_correct / proposed if proposed else 0.0
        m.spec_num_steps = self.current_steps
        m.spec_num_draft_tokens = self.current_draft_tokens
        m.spec_total_accept_tokens += self._win_accept_tokens
        m.spec_total_forward_ct += self._win_forward
        self._win_accept_tokens = self._win_correct = self._win_forward = 0

    def request_fields(self, req: SpecRequest) -> dict[str, Any] | None:
        """The meta_info fields of a finished request, in the order SGLang writes them
        (`tokenizer_manager._calculate_spec_decoding_metrics`); None when it never verified. The
        proposed count uses the launch step count: SGLang computes it in the tokenizer process, which
        never sees the adaptive controller's switches."""
        if not req.verify_ct:
            return None
        fields: dict[str, Any] = {}
        proposed = req.verify_ct * self.launch_steps
        if proposed > 0:
            fields.update(
                spec_accept_rate=req.accepted_drafts / proposed,
                spec_accept_length=len(req.output_ids) / req.verify_ct,
                spec_num_correct_drafts=req.accepted_drafts,
                spec_num_proposed_drafts=proposed,
                spec_verify_ct=req.verify_ct,
            )
        if req.spec_histogram:
            fields["spec_correct_drafts_histogram"] = list(req.spec_histogram)
        return fields

    def snapshot(self) -> dict[str, Any]:
        """The simulator's own view (`GET /sim/spec`): live steps, adaptive slots, every domain's alpha."""
        return {
            "launch_steps": self.launch_steps,
            "current_steps": self.current_steps,
            "adaptive": self.adaptive.snapshot() if self.adaptive is not None else None,
            "decode_log_interval": self.decode_log_interval,
            **self.workload.snapshot(self.base_alpha, time.monotonic(), self.time_scale),
        }


def spec_decoder_for(spec: WorkerSpec, timing: TimingModel) -> SpecDecoder | None:
    """The decoder a worker starts with (None when speculation is off): a fresh adaptive controller on
    every start, as a relaunched SGLang server has; the workload (and its drift clock) is the spec's."""
    if timing.spec_alpha is None:
        return None
    adaptive = None
    if spec.spec_adaptive:
        adaptive = AdaptiveSpeculativeParams(timing.spec_gamma, spec.spec_adaptive_config)
    return SpecDecoder(
        timing,
        spec.spec_workload,
        WorkerMetrics(),
        time_scale=spec.time_scale,
        adaptive=adaptive,
        decode_log_interval=spec.decode_log_interval,
    )
