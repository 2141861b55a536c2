"""Speculative-decoding acceptance measured at the router: from every finished response, per decode
worker, per workload label, and (at read time) per (target, draft) pair.

Source: the speculative fields SGLang writes into the FINISHING response only (the non-stream answer or
the last SSE event; `core.routing.spec_fields` decodes them and cites where SGLang writes each), so the
request path pays for one dict lookup on responses without them and a constant amount of work on those
with them: no per-chunk parsing, no scan over the window.

Per (decode, label) the router keeps
- a rolling window of the last `window` requests (a ring of per-request counts and running sums: O(1)
  per request, old requests leave the sums as new ones enter), and
- an exponentially weighted average of the same counts with a half-life of a tenth of the window (20
  requests of 200): it follows a drift within tens of requests, where the window takes its whole length
  to forget the old acceptance.

alpha is the pooled maximum-likelihood estimate of the per-draft acceptance (accepted drafts /
(accepted + rejections), a rejection being a verify step that accepted fewer drafts than it proposed;
`spec_fields.alpha_from_histogram`), so it is exact at a fixed step count whatever the request lengths.
SGLang's own ratios are kept too: accept length (completion tokens / verify steps) and accept rate
(correct / proposed drafts), as SGLang's bench_serving and /metrics report them.

Workload label: the `domain` of SGLang's per-request `custom_labels` (the body's, else the
`x-custom-labels` header's, as SGLang reads them), else the named prefix the request matched
(`prefix:NAME`), else `unlabelled`. Cardinality is bounded: at most `max_labels` per decode, `other`
included; a new label takes the slot of one idle for `label_idle_s`, else it is counted under `other`.

A decode's numbers start over when it restarts (its /server_info start time changed: a relaunch with
other speculative settings must not be judged on the old settings' requests) or is removed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.routing.spec_fields import (
    INTERNAL_ADAPTIVE,
    INTERNAL_NUM_STEPS,
    META_CORRECT_DRAFTS_HISTOGRAM,
    META_VERIFY_CT,
    SpecFieldError,
    SpecFields,
    decode_generate_response,
    decode_openai_response,
)
from infer_ctl.router.http.jsonio import DecodeError, loads
from infer_ctl.router.observe.temperature import TemperatureBands, band_of, temperature_of

LABEL_KEY = "domain"
LABELS_HEADER = "x-custom-labels"  # SGLang's --tokenizer-metrics-custom-labels-header default
UNLABELLED = "unlabelled"
OTHER = "other"
#: the decode-wide series' label value (metrics, `router spec`): a client's own "all" must not collide
#: with it (two series with the same labels in one scrape)
ALL = "all"
_MAX_LABEL_CHARS = 64

# one request's counts: requests, verify steps, completion tokens, correct drafts, proposed drafts,
# accepted drafts and rejections for alpha (the last two float: estimated when there is no histogram)
Counts = tuple[int, int, int, int, int, float, float]
_ZERO: Counts = (0, 0, 0, 0, 0, 0.0, 0.0)


def counts_of(f: SpecFields) -> Counts:
    d = f.drafts_per_verify
    hist = f.correct_drafts_histogram
    if hist:
        accepted = float(sum(k * n for k, n in enumerate(hist)))
        rejected = float(sum(n for k, n in enumerate(hist) if k < d)) if d > 0 else 0.0
    else:
        a = f.alpha
        accepted = float(f.num_correct_drafts)
        rejected = f.verify_ct * (1.0 - a**d) if a is not None and d > 0 else 0.0
    return (1, f.verify_ct, f.completion_tokens, f.num_correct_drafts, f.num_proposed_drafts, accepted, rejected)


def _ratios(c: Iterable[float]) -> dict[str, float | None]:
    _req, verify, completion, correct, proposed, accepted, rejected = c
    return {
        "alpha": round(accepted / (accepted + rejected), 4) if accepted + rejected > 0 else None,
        "accept_length": round(completion / verify, 4) if verify else None,
        "accept_rate": round(correct / proposed, 4) if proposed else None,
    }


class Rolling:
    """Sums over the last `window` requests, an EMA of the same counts, and all-time totals."""

    __slots__ = ("ema", "ema_weight", "last_at", "ring", "sums", "totals", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.ema_weight = 1.0 - 0.5 ** (10.0 / window)
        self.ring: deque[Counts] = deque()
        self.sums = list(_ZERO)
        self.totals = list(_ZERO)
        self.ema: list[float] | None = None
        self.last_at = 0.0

    def add(self, c: Counts, now: float) -> None:
        sums, totals = self.sums, self.totals
        if len(self.ring) >= self.window:
            old = self.ring.popleft()
            for i in range(7):
                sums[i] -= old[i]
        self.ring.append(c)
        for i in range(7):
            sums[i] += c[i]
            totals[i] += c[i]
        w = self.ema_weight
        if self.ema is None:
            self.ema = [float(x) for x in c]
        else:
            ema = self.ema
            for i in range(7):
                ema[i] += w * (c[i] - ema[i])
        self.last_at = now

    @property
    def requests(self) -> int:
        return int(self.sums[0])

    def window_alpha(self) -> float | None:
        a, r = self.sums[5], self.sums[6]
        return a / (a + r) if a + r > 0 else None

    def as_dict(self) -> dict[str, Any]:
        ema = _ratios(self.ema) if self.ema else {"alpha": None, "accept_length": None, "accept_rate": None}
        return {
            "window": {"requests": int(self.sums[0]), "verify_ct": int(self.sums[1]), **_ratios(self.sums)},
            "ema": {k: v for k, v in ema.items() if k != "accept_rate"},
            "total": {"requests": int(self.totals[0]), **_ratios(self.totals)},
        }


@dataclass
class DecodeSpec:
    """What the router knows about one decode's speculation: its draft/target pair and live step count
    (from /server_info), and its acceptance overall and per label."""

    url: str
    window: int
    target: str | None = None
    draft: str | None = None
    algorithm: str | None = None
    #: live step count (internal_states: SGLang's adaptive controller overrides it at run time)
    num_steps: int | None = None
    eagle_topk: int | None = None
    adaptive: bool | None = None
    overall: Rolling = field(init=False)
    labels: dict[str, Rolling] = field(default_factory=dict)
    #: the decode's requests by temperature band (temperature.py): gamma >= 6 on hot traffic wastes drafts
    temperature: TemperatureBands = field(init=False)

    def __post_init__(self) -> None:
        self.overall = Rolling(self.window)
        self.temperature = TemperatureBands(self.window)

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "target": self.target, "draft": self.draft, "algorithm": self.algorithm,
            "num_steps": self.num_steps, "eagle_topk": self.eagle_topk, "adaptive": self.adaptive,
            **self.overall.as_dict(),
            "temperature_bands": self.temperature.as_dict(),
            "labels": {name: r.as_dict() for name, r in sorted(self.labels.items())},
        }


def _label_value(v: Any) -> str | None:
    if isinstance(v, str) and v.strip():
        label = v.strip().lower()[:_MAX_LABEL_CHARS]
        return f"{LABEL_KEY}:{ALL}" if label == ALL else label
    return None


def workload_label(body: Mapping[str, Any], headers: Mapping[str, str], named: str | None) -> str:
    labels = body.get("custom_labels")
    if isinstance(labels, Mapping):
        v = _label_value(labels.get(LABEL_KEY))
        if v:
            return v
    raw = headers.get(LABELS_HEADER)
    if raw:
        try:
            parsed = loads(raw.encode())
        except (DecodeError, ValueError):
            parsed = None
        if isinstance(parsed, Mapping):
            v = _label_value(parsed.get(LABEL_KEY))
            if v:
                return v
    return f"prefix:{named}"[:_MAX_LABEL_CHARS] if named else UNLABELLED


def fields_of(obj: Any) -> list[SpecFields]:
    """The speculative fields of a finished answer (native: per prompt; OpenAI: per choice, present only
    when the client asked with return_spec_tokens_details). Malformed fields are not the client's
    problem: they are skipped."""
    try:
        if isinstance(obj, dict) and "sglext" in obj:
            found = decode_openai_response(obj)
        else:
            found = decode_generate_response(obj) if isinstance(obj, dict | list) else []
    except SpecFieldError:
        return []
    return [f for f in found if f is not None]


class SpecStats:
    def __init__(self, *, window: int, max_labels: int, label_idle_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`window` and `max_labels`: the profile's speculative.window_requests and router.spec_max_labels
        (router/daemon/assembly.py passes them): no default here."""
        self.window = window
        self.max_labels = max_labels
        self.label_idle_s = label_idle_s
        self.clock = clock
        self.decodes: dict[str, DecodeSpec] = {}
        #: the controller's actions reported to the router (newest last), for the status view
        self.actions: deque[dict[str, Any]] = deque(maxlen=50)
        #: per decode (or collocated worker): its /server_info disaggregation_transfer_backend and
        #: disaggregation_ib_device, the KV fabric its requests' spans name (tracing.py)
        self.fabric: dict[str, tuple[str | None, str | None]] = {}

    def _decode(self, url: str) -> DecodeSpec:
        d = self.decodes.get(url)
        if d is None:
            d = self.decodes[url] = DecodeSpec(url, self.window)
        return d

    # ---- the request path ----------------------------------------------------------------------
    def answered(self, decode: str, body: Mapping[str, Any], headers: Mapping[str, str], named: str | None,
                 obj: Any) -> None:
        """One finished answer of `decode` (the worker that generated it)."""
        known = self.decodes.get(decode)
        if known is not None and known.algorithm:  # a speculative decode: every answer of it was speculated
            known.temperature.add(band_of(temperature_of(body)))
        if type(obj) is dict and "sglext" not in obj:  # the common case, checked without a call chain:
            meta = obj.get("meta_info")  # an answer without speculative fields costs two lookups
            if type(meta) is not dict or (META_VERIFY_CT not in meta and META_CORRECT_DRAFTS_HISTOGRAM not in meta):
                return
        found = fields_of(obj)
        if not found:
            return
        now = self.clock()
        d = self._decode(decode)
        if known is None or not known.algorithm:  # its /server_info not read yet: the fields say it speculates
            d.temperature.add(band_of(temperature_of(body)))
        roll = self._label(d, workload_label(body, headers, named), now)
        for f in found:
            c = counts_of(f)
            d.overall.add(c, now)
            roll.add(c, now)

    def _label(self, d: DecodeSpec, label: str, now: float) -> Rolling:
        labels = d.labels
        roll = labels.get(label)
        if roll is not None:
            return roll
        if len(labels) - (OTHER in labels) >= self.max_labels - 1:  # one slot stays for "other"
            idle = [k for k, r in labels.items() if k != OTHER and now - r.last_at > self.label_idle_s]
            if idle:
                del labels[min(idle, key=lambda k: labels[k].last_at)]
            else:
                label = OTHER
                roll = labels.get(OTHER)
                if roll is not None:
                    return roll
        roll = labels[label] = Rolling(self.window)
        return roll

    # ---- what the health checks learn ----------------------------------------------------------
    def observe_server_info(self, url: str, info: Any) -> None:
        """A decode's (or collocated worker's) draft/target pair and live step count, and its KV fabric."""
        if not isinstance(info, Mapping):
            return
        self.fabric[url] = (_str(info.get("disaggregation_transfer_backend")), _str(info.get("disaggregation_ib_device")))
        if not info.get("speculative_algorithm"):
            return
        d = self._decode(url)
        d.target = _str(info.get("model_path"))
        d.draft = _str(info.get("speculative_draft_model_path"))
        d.algorithm = _str(info.get("speculative_algorithm"))
        d.eagle_topk = _int(info.get("speculative_eagle_topk"))
        d.num_steps = _int(info.get("speculative_num_steps"))
        d.adaptive = info.get("speculative_adaptive") if isinstance(info.get("speculative_adaptive"), bool) else None
        states = info.get("internal_states")
        if isinstance(states, list) and states and isinstance(states[0], Mapping):
            live = _int(states[0].get(INTERNAL_NUM_STEPS))
            d.num_steps = live if live is not None else d.num_steps
            if isinstance(states[0].get(INTERNAL_ADAPTIVE), bool):
                d.adaptive = states[0][INTERNAL_ADAPTIVE]

    def reset(self, url: str) -> None:
        """The decode restarted: its measurements belong to the process that is gone (what it runs now is
        kept: the health check that saw the restart read it from the new process)."""
        d = self.decodes.get(url)
        if d is not None:
            d.overall = Rolling(self.window)
            d.labels.clear()
            d.temperature.restart()

    def drop(self, url: str) -> None:
        """The decode left the router."""
        self.decodes.pop(url, None)
        self.fabric.pop(url, None)

    # ---- readers -------------------------------------------------------------------------------
    def record_action(self, action: dict[str, Any]) -> None:
        self.actions.append(action)

    def snapshot(self) -> dict[str, Any]:
        decodes = [d.as_dict() for d in self.decodes.values()]
        pairs: dict[tuple[str | None, str | None], list[float]] = {}
        labels: dict[str, list[float]] = {}
        for d in self.decodes.values():
            acc = pairs.setdefault((d.target, d.draft), list(_ZERO))
            for i, v in enumerate(d.overall.sums):
                acc[i] += v
            for name, r in d.labels.items():
                lacc = labels.setdefault(name, list(_ZERO))
                for i, v in enumerate(r.sums):
                    lacc[i] += v
        return {
            "window_requests": self.window,
            "max_labels": self.max_labels,
            "decodes": decodes,
            "pairs": [{"target": t, "draft": dr, "requests": int(s[0]), **_ratios(s)} for (t, dr), s in pairs.items()],
            "labels": {name: {"requests": int(s[0]), **_ratios(s)} for name, s in sorted(labels.items())},
            "actions": list(self.actions),
        }


def _str(v: Any) -> str | None:
    return str(v) if isinstance(v, str) and v else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None
