"""SGLang 0.5.23's speculative-decoding telemetry, decoded. Pure: dicts and text in, values out.

One decoder for every reader (the router, the checks, the bench, the simulator's tests), so what is
measured on the simulator is measured the same way on a real SGLang server. Where each field comes from
(paths under `sglang/srt/` of the sglang 0.5.23 wheel):

- Per request, `meta_info` of the FINISHING chunk only (non-stream answer, or the last SSE chunk):
  `managers/tokenizer_manager.py`, `TokenizerManager._calculate_spec_decoding_metrics`, called from
  `_handle_batch_output` when `state.finished` and a speculative algorithm is set. It writes, only when
  the request had a verify step (`spec_verify_ct > 0`) and proposed drafts:
  `spec_accept_rate` = num_correct_drafts / num_proposed_drafts (no bonus token),
  `spec_accept_length` = completion_tokens / spec_verify_ct (includes the bonus token and, because
  completion_tokens counts it, the first token a prefill produced),
  `spec_num_correct_drafts`, `spec_num_proposed_drafts` = spec_verify_ct x (speculative_num_draft_tokens
  - 1) read from the launch config (`get_spec()`, NOT the live adaptive step count), `spec_verify_ct`;
  and, when non-empty, `spec_correct_drafts_histogram`: list index k = number of verify steps that
  accepted k drafts (`managers/schedule_batch.py`, `Req.update_spec_correct_drafts_histogram`; counts
  come from the verify result, `scheduler_components/batch_result_processor.py`). A prefill server of a
  PD pair never verifies, so its answers carry none of these. OpenAI endpoints return the same keys
  (`entrypoints/openai/protocol.py`, `SpecTokensDetails`) at the response level in
  `sglext.spec_tokens_details` (a list when n > 1) when the request sets `return_spec_tokens_details`.
- `/metrics` (`observability/metrics_collector.py`): gauges `sglang:spec_accept_length`,
  `sglang:spec_accept_rate`, `sglang:spec_num_steps` and `sglang:spec_num_draft_tokens` (live: the
  adaptive controller's current values, `metrics_reporter._active_spec_config_snapshot`), counter
  `sglang:spec_verify_calls_total` (incremented by a request's spec_verify_ct when it finishes). The
  gauges are set every `--decode-log-interval` (40) decode batches from that interval only
  (`scheduler_components/metrics_reporter.py`, `report_decode_stats`); accept_rate's denominator is the
  scheduler's current `speculative_num_draft_tokens - 1`.
- `/v1/loads` (`managers/load_snapshot.py`, `SpeculativeMetrics`; `include=spec` selects it): each load's
  `speculative` = {`accept_length`: totals since start, `accept_rate`: the last interval's}, absent until
  the first interval completed (`scheduler_components/load_inquirer.py`).
- `/server_info` `internal_states[i].avg_spec_accept_length` (same totals;
  `scheduler_components/internal_state.py`, `_add_speculative` / `_average_accept_length`), absent
  likewise. The state also carries the scheduler's resolved server args with its run-time overrides
  (`get_context().resolved_server_args_dict()`): the adaptive controller overrides
  `speculative_num_steps` / `speculative_num_draft_tokens` on every switch
  (`speculative/eagle_worker_v2.py`, `apply_runtime_state`), so those are live there too, while the
  top-level /server_info fields and the tokenizer process (hence meta_info) keep the launch values.

alpha (the per-draft acceptance probability of Leviathan et al.) is not a field: SGLang's accept_rate is
E[accepted]/gamma, which for chain drafts (EAGLE topk 1: acceptance stops at the first rejection) is below
alpha. `alpha_from_histogram` is the exact maximum-likelihood estimate from the histogram.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# -- field names, as SGLang 0.5.23 spells them --------------------------------------------------------
META_VERIFY_CT = "spec_verify_ct"
META_ACCEPT_LENGTH = "spec_accept_length"
META_ACCEPT_RATE = "spec_accept_rate"
META_NUM_CORRECT_DRAFTS = "spec_num_correct_drafts"
META_NUM_PROPOSED_DRAFTS = "spec_num_proposed_drafts"
META_CORRECT_DRAFTS_HISTOGRAM = "spec_correct_drafts_histogram"
#: written together by `_calculate_spec_decoding_metrics` (in this order)
META_SCALARS = (
    META_ACCEPT_RATE,
    META_ACCEPT_LENGTH,
    META_NUM_CORRECT_DRAFTS,
    META_NUM_PROPOSED_DRAFTS,
    META_VERIFY_CT,
)
META_FIELDS = (*META_SCALARS, META_CORRECT_DRAFTS_HISTOGRAM)

METRIC_ACCEPT_LENGTH = "sglang:spec_accept_length"
METRIC_ACCEPT_RATE = "sglang:spec_accept_rate"
METRIC_NUM_STEPS = "sglang:spec_num_steps"
METRIC_NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"
METRIC_VERIFY_CALLS_TOTAL = "sglang:spec_verify_calls_total"
METRIC_NAMES = (
    METRIC_ACCEPT_LENGTH,
    METRIC_ACCEPT_RATE,
    METRIC_NUM_STEPS,
    METRIC_NUM_DRAFT_TOKENS,
    METRIC_VERIFY_CALLS_TOTAL,
)

LOADS_SECTION = "speculative"
LOADS_INCLUDE = "spec"  # /v1/loads?include=spec
LOADS_FIELDS = ("accept_length", "accept_rate")
INTERNAL_AVG_ACCEPT_LENGTH = "avg_spec_accept_length"
INTERNAL_NUM_STEPS = "speculative_num_steps"
INTERNAL_NUM_DRAFT_TOKENS = "speculative_num_draft_tokens"
INTERNAL_ADAPTIVE = "speculative_adaptive"
OPENAI_DETAILS = "spec_tokens_details"  # under the response's "sglext"
OPENAI_REQUEST_FLAG = "return_spec_tokens_details"


class SpecFieldError(ValueError):
    """Speculative fields are present but not shaped as SGLang writes them."""


# Plausibility bounds: what no real request reaches, so a hostile or corrupt answer is refused instead of
# poisoning a window for `window` requests (or, unbounded, costing the router's event loop time).
#: draft tokens per verify step (SGLang's speculative_num_draft_tokens - 1; EAGLE trees and n-gram drafts
#: stay in the tens)
MAX_DRAFTS_PER_VERIFY = 1024
#: verify steps of one request (each yields >= 1 token, so at most its completion tokens)
MAX_VERIFY_CT = 1 << 24


# -- alpha --------------------------------------------------------------------------------------------
def alpha_from_histogram(histogram: Sequence[int], drafts: int) -> float | None:
    """Maximum-likelihood per-draft acceptance for chain drafts of `drafts` tokens per verify step.

    A step that accepted k < drafts drafts saw k acceptances then one rejection; a step that accepted all
    of them saw no rejection. So alpha = acceptances / (acceptances + rejections), exact for i.i.d.
    acceptance. With `--speculative-adaptive` the live step count varies while SGLang reports the launch
    value; steps with k >= drafts then count as unrejected (an estimate, no longer exact).
    """
    if drafts <= 0:
        return None
    accepted = sum(k * n for k, n in enumerate(histogram))
    rejected = sum(n for k, n in enumerate(histogram) if k < drafts)
    total = accepted + rejected
    return accepted / total if total else None


def expected_correct(alpha: float, drafts: int) -> float:
    """E[accepted drafts per verify step] = alpha + alpha^2 + ... + alpha^drafts (closed form: O(1) in
    `drafts`, it runs on the router's request path)."""
    if drafts <= 0:
        return 0.0
    if alpha >= 1.0:
        return float(drafts)
    return alpha * (1.0 - alpha**drafts) / (1.0 - alpha)


def alpha_from_mean_correct(mean_correct: float, drafts: int) -> float | None:
    """alpha whose E[accepted drafts per step] is `mean_correct` (bisection; the mean rises with alpha).
    For readers that have no histogram; less efficient than `alpha_from_histogram`."""
    if drafts <= 0 or math.isnan(mean_correct):
        return None
    if mean_correct <= 0:
        return 0.0
    if mean_correct >= drafts:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_correct(mid, drafts) < mean_correct:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


# -- per request --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpecFields:
    """One finished request's speculative fields (SGLang's `meta_info` / `SpecTokensDetails`)."""

    verify_ct: int
    accept_length: float
    accept_rate: float
    num_correct_drafts: int
    num_proposed_drafts: int
    correct_drafts_histogram: tuple[int, ...] = ()

    @property
    def drafts_per_verify(self) -> int:
        """SGLang's launch `speculative_num_draft_tokens - 1` (proposed = verify_ct x this)."""
        return self.num_proposed_drafts // self.verify_ct if self.verify_ct else 0

    @property
    def completion_tokens(self) -> int:
        return round(self.accept_length * self.verify_ct)

    @property
    def alpha(self) -> float | None:
        """Estimated per-draft acceptance probability (histogram MLE, else from the mean)."""
        d = self.drafts_per_verify
        if self.correct_drafts_histogram:
            return alpha_from_histogram(self.correct_drafts_histogram, d)
        if not self.verify_ct:
            return None
        return alpha_from_mean_correct(self.num_correct_drafts / self.verify_ct, d)


def _int(meta: Mapping[str, Any], key: str) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SpecFieldError(f"{key} must be a non-negative integer, got {v!r}")
    return v


def _float(meta: Mapping[str, Any], key: str) -> float:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise SpecFieldError(f"{key} must be a non-negative number, got {v!r}")
    return float(v)


def _histogram(meta: Mapping[str, Any]) -> tuple[int, ...]:
    h = meta.get(META_CORRECT_DRAFTS_HISTOGRAM)
    if h is None:
        return ()
    if not isinstance(h, list):
        raise SpecFieldError(f"{META_CORRECT_DRAFTS_HISTOGRAM} must be a list of counts, got {h!r}"[:200])
    # the length first: a hostile answer's million entries are refused without looking at each one
    if len(h) > MAX_DRAFTS_PER_VERIFY + 1:  # index k = drafts accepted in one step
        raise SpecFieldError(f"{META_CORRECT_DRAFTS_HISTOGRAM} has {len(h)} entries, more than any draft")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in h):
        raise SpecFieldError(f"{META_CORRECT_DRAFTS_HISTOGRAM} must be a list of counts, got {h!r}"[:200])
    return tuple(h)


def decode_meta_info(meta: Mapping[str, Any]) -> SpecFields | None:
    """The speculative fields of one `meta_info` (or one OpenAI `SpecTokensDetails` dict).

    None when there are none: speculation off, a non-final stream chunk, a prefill server's answer, a
    request that never verified (SpecTokensDetails then says spec_verify_ct 0). Raises SpecFieldError
    when they are present but malformed or incomplete.
    """
    if not any(k in meta for k in META_FIELDS):
        return None
    hist = _histogram(meta)
    if META_VERIFY_CT not in meta:
        # SGLang writes the histogram without the scalars when no draft was proposed per step (an
        # adaptive server launched at 0 steps): every step then accepted 0 drafts, one token each.
        if any(k in meta for k in META_SCALARS):
            raise SpecFieldError(f"speculative fields without {META_VERIFY_CT}: {sorted(meta)}")
        if not hist:
            return None
        steps = sum(hist)
        if len(hist) > 1 or steps > MAX_VERIFY_CT:  # 0 drafts per step: every step accepted 0
            raise SpecFieldError(f"{META_CORRECT_DRAFTS_HISTOGRAM} without drafts must count 0-draft steps only")
        return SpecFields(steps, 1.0, 0.0, 0, 0, hist)
    verify_ct = _int(meta, META_VERIFY_CT)
    if verify_ct == 0:
        return None
    missing = [k for k in META_SCALARS if k not in meta]
    if missing:
        raise SpecFieldError(f"incomplete speculative fields, missing {', '.join(missing)}")
    fields = SpecFields(
        verify_ct=verify_ct,
        accept_length=_float(meta, META_ACCEPT_LENGTH),
        accept_rate=_float(meta, META_ACCEPT_RATE),
        num_correct_drafts=_int(meta, META_NUM_CORRECT_DRAFTS),
        num_proposed_drafts=_int(meta, META_NUM_PROPOSED_DRAFTS),
        correct_drafts_histogram=hist,
    )
    _check_consistent(fields)
    return fields


def _check_consistent(f: SpecFields) -> None:
    """SGLang derives these fields from one another (`_calculate_spec_decoding_metrics`; the histogram and
    the correct-drafts count are updated together, `batch_result_processor.py`): answers that break
    those relations, or claim what no request does, are refused rather than counted."""
    if f.verify_ct > MAX_VERIFY_CT:
        raise SpecFieldError(f"{META_VERIFY_CT} {f.verify_ct} is beyond any request")
    if f.num_proposed_drafts % f.verify_ct or f.num_proposed_drafts // f.verify_ct > MAX_DRAFTS_PER_VERIFY:
        raise SpecFieldError(f"{META_NUM_PROPOSED_DRAFTS} {f.num_proposed_drafts} is not {META_VERIFY_CT} "
                             f"{f.verify_ct} x a draft count")
    # a verify step yields its accepted drafts + 1; the first token may come from the prefill
    if f.num_correct_drafts > f.verify_ct * MAX_DRAFTS_PER_VERIFY:
        raise SpecFieldError(f"{META_NUM_CORRECT_DRAFTS} {f.num_correct_drafts} exceeds any draft")
    if not 1.0 <= f.accept_length <= MAX_DRAFTS_PER_VERIFY + 2:
        raise SpecFieldError(f"{META_ACCEPT_LENGTH} {f.accept_length} is outside [1, drafts + 2]")
    if f.num_proposed_drafts:
        rate = f.num_correct_drafts / f.num_proposed_drafts
        if abs(f.accept_rate - rate) > 1e-6 * max(1.0, rate):
            raise SpecFieldError(f"{META_ACCEPT_RATE} {f.accept_rate} is not {META_NUM_CORRECT_DRAFTS} / "
                                 f"{META_NUM_PROPOSED_DRAFTS} ({rate:.6g})")
    hist = f.correct_drafts_histogram
    if hist:
        if sum(hist) != f.verify_ct:
            raise SpecFieldError(f"histogram counts {sum(hist)} steps, {META_VERIFY_CT} is {f.verify_ct}")
        accepted = sum(k * n for k, n in enumerate(hist))
        if accepted != f.num_correct_drafts:
            raise SpecFieldError(f"histogram counts {accepted} accepted drafts, {META_NUM_CORRECT_DRAFTS} is "
                                 f"{f.num_correct_drafts}")


def decode_generate_response(body: Any) -> list[SpecFields | None]:
    """Per prompt, from a native /generate answer (one result dict, a batch list, or one SSE chunk)."""
    items = body if isinstance(body, list) else [body]
    out: list[SpecFields | None] = []
    for item in items:
        meta = item.get("meta_info") if isinstance(item, Mapping) else None
        out.append(decode_meta_info(meta) if isinstance(meta, Mapping) else None)
    return out


def decode_openai_response(body: Any) -> list[SpecFields | None]:
    """Per choice, from an OpenAI answer or its final SSE chunk: `sglext.spec_tokens_details`."""
    ext = body.get("sglext") if isinstance(body, Mapping) else None
    details = ext.get(OPENAI_DETAILS) if isinstance(ext, Mapping) else None
    if details is None:
        return []
    items = details if isinstance(details, list) else [details]
    return [decode_meta_info(d) if isinstance(d, Mapping) else None for d in items]


# -- many requests ------------------------------------------------------------------------------------
@dataclass
class SpecTally:
    """Speculative fields summed over requests: SGLang's ratios over the sum, and a pooled alpha."""

    requests: int = 0
    verify_ct: int = 0
    completion_tokens: int = 0
    num_correct_drafts: int = 0
    num_proposed_drafts: int = 0
    #: drafts per verify step -> summed histogram (one per step count: alpha needs the step count)
    histograms: dict[int, list[int]] = field(default_factory=dict)
    #: requests that came without a histogram: (drafts per verify, verify steps, correct drafts)
    no_histogram: list[tuple[int, int, int]] = field(default_factory=list)

    def add(self, f: SpecFields) -> None:
        self.requests += 1
        self.verify_ct += f.verify_ct
        self.completion_tokens += f.completion_tokens
        self.num_correct_drafts += f.num_correct_drafts
        self.num_proposed_drafts += f.num_proposed_drafts
        d = f.drafts_per_verify
        if f.correct_drafts_histogram:
            h = self.histograms.setdefault(d, [])
            for k, n in enumerate(f.correct_drafts_histogram):
                if k >= len(h):
                    h.extend([0] * (k + 1 - len(h)))
                h[k] += n
        else:
            self.no_histogram.append((d, f.verify_ct, f.num_correct_drafts))

    def extend(self, fields: Iterable[SpecFields | None]) -> None:
        for f in fields:
            if f is not None:
                self.add(f)

    @property
    def accept_rate(self) -> float | None:
        return self.num_correct_drafts / self.num_proposed_drafts if self.num_proposed_drafts else None

    @property
    def accept_length(self) -> float | None:
        return self.completion_tokens / self.verify_ct if self.verify_ct else None

    @property
    def alpha(self) -> float | None:
        """Pooled maximum-likelihood alpha over every histogram (each with its own step count); requests
        without one are left out unless none has one (then: from the mean accepted drafts)."""
        accepted = rejected = 0
        for d, h in self.histograms.items():
            if d <= 0:
                continue
            accepted += sum(k * n for k, n in enumerate(h))
            rejected += sum(n for k, n in enumerate(h) if k < d)
        if accepted + rejected:
            return accepted / (accepted + rejected)
        steps = sum(v for d, v, _ in self.no_histogram if d > 0)
        if not steps:
            return None
        drafts = round(sum(d * v for d, v, _ in self.no_histogram if d > 0) / steps)
        return alpha_from_mean_correct(sum(c for d, _, c in self.no_histogram if d > 0) / steps, drafts)


# -- per server ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpecGauges:
    """The speculative samples of one `/metrics` text (None: the family is not exported)."""

    accept_length: float | None = None
    accept_rate: float | None = None
    num_steps: float | None = None
    num_draft_tokens: float | None = None
    verify_calls_total: float | None = None


def _metric_samples(text: str, names: set[str]) -> dict[str, float]:
    """First sample of each wanted family in a Prometheus exposition text."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        cut = line.find("{")
        if cut < 0:
            name, _, rest = line.partition(" ")
        else:
            name, rest = line[:cut], line[line.rfind("}") + 1 :]
        if name not in names or name in found:
            continue
        parts = rest.split()
        try:
            found[name] = float(parts[0])
        except (IndexError, ValueError):
            continue
    return found


def decode_metrics_text(text: str) -> SpecGauges:
    """The `sglang:spec_*` samples of `/metrics` (the first label set of each, i.e. DP rank 0)."""
    s = _metric_samples(text, set(METRIC_NAMES))
    return SpecGauges(
        accept_length=s.get(METRIC_ACCEPT_LENGTH),
        accept_rate=s.get(METRIC_ACCEPT_RATE),
        num_steps=s.get(METRIC_NUM_STEPS),
        num_draft_tokens=s.get(METRIC_NUM_DRAFT_TOKENS),
        verify_calls_total=s.get(METRIC_VERIFY_CALLS_TOTAL),
    )


@dataclass(frozen=True)
class SpecInternalState:
    """The speculative part of one `/server_info` `internal_states` entry (None where absent)."""

    avg_accept_length: float | None
    num_steps: int | None  # live under --speculative-adaptive
    num_draft_tokens: int | None
    adaptive: bool | None


def _opt_float(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def decode_server_info(info: Any) -> list[SpecInternalState]:
    """One entry per `internal_states` entry of a `/server_info` answer."""
    states = info.get("internal_states") if isinstance(info, Mapping) else None
    out: list[SpecInternalState] = []
    for st in states if isinstance(states, list) else []:
        st = st if isinstance(st, Mapping) else {}
        adaptive = st.get(INTERNAL_ADAPTIVE)
        out.append(SpecInternalState(
            avg_accept_length=_opt_float(st.get(INTERNAL_AVG_ACCEPT_LENGTH)),
            num_steps=_opt_int(st.get(INTERNAL_NUM_STEPS)),
            num_draft_tokens=_opt_int(st.get(INTERNAL_NUM_DRAFT_TOKENS)),
            adaptive=adaptive if isinstance(adaptive, bool) else None,
        ))
    return out
