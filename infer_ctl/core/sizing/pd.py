"""`plan pd`: the prefill:decode split of a GPU budget that serves the most requests within both
objectives (TTFT and ITL) per GPU, and whether collocated serving on the same GPUs does as well.

Per server (one SGLang instance of `tp` GPUs), from the sizing model the other `plan` commands use:

    prefill s(L)   = max(prefill_flops(L) / (peak x tp x mfu), weights / (HBM B/s x tp x eff))
    transfer s(L)  = plan transfer(L x KV bytes per token, fabric Gb/s x links, latency)
    decode step(B) = roofline step at batch B, context = the mean context a decoding sequence holds, / eff
    KV room        = (HBM x tp x mem_fraction - weights) / KV bytes per token       (B cannot exceed it)

Disaggregated, n_p prefill and n_d decode servers, Poisson arrivals at rate lam spread evenly:
    prefill queue  = M/G/1 at lam / n_p with service s(L) over the request classes (queueing.py)
    TTFT(class)    = wait + s(L) + transfer(L);   met when wait <= TTFT objective - s(L) - transfer(L)
    decode         = B sequences per server with B / step(B) = lam / n_d x E[output] (Little's law);
                     ITL = step(B); met by every request when ITL <= objective, by none otherwise
Collocated, n servers (SGLang runs waiting prefills before the next decode step):
    prefill queue  = M/G/1 at lam / n (prefill load only: it has priority) + half a decode step
    decode         = B / step(B) x (1 - rho_prefill) = lam / n x E[output];  ITL = step(B) / (1 - rho_prefill)
    (prefill time is taken out of the decode batch's time: chunked prefill spreads it, the mean stays)

    attainment = sum over classes of weight x P(TTFT met) x [ITL met]
    goodput    = lam x attainment;   per GPU = goodput / GPUs the split uses
    capacity   = the largest lam whose attainment >= the target (DistServe's goodput, 90 %)

Splits are ranked by goodput per GPU at the given rate, then capacity per GPU. The arithmetic of the
best split and of collocated serving is spelled out by `pd_steps.explain`. docs/sizing.md has the
assumptions and the comparison with DistServe and Splitwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.kv import shape_of
from infer_ctl.core.sizing.queueing import mg1_mean_wait, mg1_wait_at_most, utilisation
from infer_ctl.core.sizing.roofline import plan_roofline, prefill_flops
from infer_ctl.core.sizing.transfer import plan_transfer

_EPS = 1e-12
_TIE = 1.05  # a gain below 5 % is inside what this model can tell apart
_NEAR = 0.01  # goodputs this close are the same traffic served: rank those by capacity


@dataclass(frozen=True)
class RequestClass:
    input_tokens: int
    output_tokens: int
    weight: float = 1.0  # share of requests (normalised over the classes)


@dataclass(frozen=True)
class Hardware:
    accelerator: str = "h100-sxm"
    tp: int = 8  # GPUs per server

    @property
    def label(self) -> str:
        return f"{self.tp} x {self.accelerator}"


@dataclass(frozen=True)
class Link:
    bandwidth_gbps: float = 400.0  # per NIC
    links: int = 1  # NICs a transfer stripes over
    latency_us: float = 5.0


@dataclass(frozen=True)
class PdInputs:
    classes: tuple[RequestClass, ...]
    rate_rps: float
    ttft_slo_s: float
    itl_slo_s: float
    gpus: int
    prefill: Hardware = field(default_factory=Hardware)
    decode: Hardware = field(default_factory=Hardware)
    model: str = "llama-3.1-70b"
    link: Link = field(default_factory=Link)
    prefill_mfu: float = 0.5
    decode_efficiency: float = 0.7
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    mem_fraction: float = 0.85
    attainment_target: float = 0.9


def spread_classes(input_mean: int, input_std: int, output_mean: int, output_std: int) -> tuple[RequestClass, ...]:
    """mean - std and mean + std in each length, independent, a quarter each: the smallest set of classes
    with the given means and standard deviations (one class per length when its std is 0)."""
    def points(name: str, mean: int, std: int) -> tuple[int, ...]:
        if mean < 1 or std < 0:
            raise ValueError(f"--{name}-tokens must be >= 1 and its spread >= 0, got {mean} ± {std}")
        if mean - std < 1:
            raise ValueError(f"--{name}-spread {std} must be below --{name}-tokens {mean} (lengths stay >= 1)")
        return (mean,) if std == 0 else (mean - std, mean + std)

    ins, outs = points("input", input_mean, input_std), points("output", output_mean, output_std)
    weight = 1.0 / (len(ins) * len(outs))
    return tuple(RequestClass(i, o, weight) for i in ins for o in outs)


@dataclass(frozen=True)
class ServerModel:
    """One server's numbers on one hardware: what every split is computed from."""
    hardware: Hardware
    prefill_s: tuple[float, ...]  # per class
    transfer_s: tuple[float, ...]  # per class (disaggregated only)
    kv_bytes_per_token: int
    kv_room_tokens: int
    weights_bytes: int
    peak_flops: float  # the server's, all tp GPUs
    bandwidth_bytes_s: float


@dataclass(frozen=True)
class Evaluation:
    layout: str  # "disaggregated" | "collocated"
    prefill_servers: int  # collocated: the servers (each does both)
    decode_servers: int
    prefill_hw: Hardware
    decode_hw: Hardware
    gpus: int
    rate_rps: float
    prefill_class_s: tuple[float, ...]  # per class, on the prefill (or collocated) hardware
    transfer_class_s: tuple[float, ...]  # per class; 0 collocated
    kv_bytes_per_token: int
    mean_prefill_s: float
    prefill_second_moment: float
    prefill_utilisation: float
    mean_wait_s: float
    ttft_met: tuple[float, ...]  # per class, P(TTFT <= objective)
    mean_ttft_s: float
    link_utilisation: float  # per prefill server's NICs; 0 collocated
    decode_demand_tokens_s: float  # per decode (or collocated) server
    decode_context: float
    decode_batch_max: float
    decode_batch: float | None  # None: the decode pool cannot keep up
    decode_step_s: float | None
    itl_s: float | None
    itl_met: bool
    attainment: float
    goodput_rps: float
    goodput_per_gpu: float
    capacity_rps: float = 0.0
    capacity_per_gpu: float = 0.0


@dataclass(frozen=True)
class PdPlan:
    inputs: PdInputs
    best: Evaluation | None  # None: the GPUs hold fewer than one prefill and one decode server
    collocated: Evaluation
    splits: tuple[Evaluation, ...]  # every disaggregated split, best first
    gain_at_rate: float  # best disaggregated / collocated goodput per GPU at the given rate
    gain_capacity: float  # the same for capacity per GPU
    answer: str  # "disaggregate" | "collocate" | "either at this rate"
    reason: str


MAX_GPUS = 4096


def check_inputs(p: PdInputs) -> None:
    """One message per bad value, named as the CLI option that sets it."""
    if not p.classes:
        raise ValueError("no request classes: give --input-tokens/--output-tokens or --class IN:OUT:WEIGHT")
    for c in p.classes:
        # an infinite weight normalised to NaN shares: every split at 0% attainment, exit 1, no error
        if c.input_tokens < 1 or c.output_tokens < 1 or not 0 < c.weight < math.inf:
            raise ValueError(f"--class {c.input_tokens}:{c.output_tokens}:{c.weight:g}: lengths must be >= 1 "
                             "and the weight a finite number > 0")
    # the objectives are held in seconds but given in ms: the message quotes what the user typed
    for name, value, shown in (("--rate", p.rate_rps, p.rate_rps), ("--ttft-ms", p.ttft_slo_s, p.ttft_slo_s * 1e3),
                               ("--itl-ms", p.itl_slo_s, p.itl_slo_s * 1e3)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {shown:g}")
    # every split is evaluated (a bisection each, ~3 ms): 1e8 GPUs ran for hours; 4,096 is a large bare-metal fleet
    if not 1 <= p.gpus <= MAX_GPUS:
        raise ValueError(f"--gpus must be in [1, {MAX_GPUS:,}], got {p.gpus:,}")
    for role, hw in (("prefill", p.prefill), ("decode", p.decode)):
        presets.accelerator_preset(hw.accelerator)
        if hw.tp < 1:
            raise ValueError(f"--{role}-tp must be >= 1, got {hw.tp}")
    presets.model_preset(p.model)
    presets.dtype_bytes(p.weight_dtype)
    presets.dtype_bytes(p.kv_dtype)
    for name, value in (("--prefill-mfu", p.prefill_mfu), ("--decode-efficiency", p.decode_efficiency),
                        ("--mem-fraction", p.mem_fraction), ("--attainment", p.attainment_target)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value:g}")
    # the comparisons are False for NaN, so a NaN is refused too (a NaN latency was planned on, exit 0)
    if not (p.link.bandwidth_gbps > 0 and math.isfinite(p.link.bandwidth_gbps) and p.link.links >= 1
            and 0 <= p.link.latency_us < math.inf):
        raise ValueError("--bandwidth-gbps must be a finite number > 0, --links >= 1, --latency-us a finite number >= 0")


def weights(p: PdInputs) -> tuple[float, ...]:
    total = sum(c.weight for c in p.classes)
    return tuple(c.weight / total for c in p.classes)


def server_model(p: PdInputs, hw: Hardware) -> ServerModel:
    m = presets.model_preset(p.model)
    acc = presets.accelerator_preset(hw.accelerator)
    kvb = shape_of(m).bytes_per_token(presets.dtype_bytes(p.kv_dtype))
    wbytes = m.params * presets.dtype_bytes(p.weight_dtype)
    peak = acc.fp16_tflops * 1e12 * hw.tp
    bw = acc.hbm_tb_s * 1e12 * hw.tp
    room = int((acc.hbm_gb * 1e9 * hw.tp * p.mem_fraction - wbytes) // kvb)
    if room < max(c.input_tokens + c.output_tokens for c in p.classes):
        raise ValueError(f"{p.model} in {p.weight_dtype} leaves KV room for {max(room, 0):,} tokens on {hw.label}: "
                         "not one request; give a larger --prefill-tp/--decode-tp")
    qk = m.attention_heads * (m.qk_head_dim or m.head_dim)
    v = m.attention_heads * m.head_dim
    # a short prompt is bound by reading the weights once, not by its FLOPs: the roofline's max
    floor_s = wbytes / (bw * p.decode_efficiency)
    pre = tuple(max(prefill_flops(params=m.flops_params, tokens=c.input_tokens, layers=m.layers, qk_dim=qk, v_dim=v)
                    / (peak * p.prefill_mfu), floor_s) for c in p.classes)
    xfer = tuple(plan_transfer(c.input_tokens * kvb, p.link.bandwidth_gbps, p.link.latency_us, p.link.links).seconds
                 for c in p.classes)
    return ServerModel(hw, pre, xfer, kvb, room, wbytes, peak, bw)


def decode_context(p: PdInputs) -> float:
    """The mean context of a sequence in the decode batch: a request stays for its output's length, so
    classes count by weight x output tokens, each at its prompt + half its output."""
    w = weights(p)
    held = sum(wi * c.output_tokens for wi, c in zip(w, p.classes, strict=True))
    return sum(wi * c.output_tokens * (c.input_tokens + c.output_tokens / 2)
               for wi, c in zip(w, p.classes, strict=True)) / held


def decode_step_s(p: PdInputs, sm: ServerModel, batch: float, context: float) -> float:
    m = presets.model_preset(p.model)
    roof = plan_roofline(params=m.params, weight_dtype_bytes=presets.dtype_bytes(p.weight_dtype),
                         peak_tflops=sm.peak_flops / 1e12, hbm_tb_s=sm.bandwidth_bytes_s / 1e12,
                         batch=max(batch, 1.0), kv_bytes_per_token=sm.kv_bytes_per_token, context=context)
    return roof.step_seconds / p.decode_efficiency


def solve_batch(p: PdInputs, sm: ServerModel, demand: float, share: float, context: float,
                batch_max: float) -> tuple[float, float] | None:
    """The batch B with B x share / step(B) = demand tokens/s (Little's law), and step(B); None when
    not even the largest batch the KV room holds keeps up."""
    def excess(b: float) -> float:
        return demand * decode_step_s(p, sm, b, context) / share - b

    if share <= 0 or excess(batch_max) > 0:
        return None
    lo, hi = 0.0, batch_max
    for _ in range(100):  # excess falls as B grows (step grows slower than B): bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
    return hi, decode_step_s(p, sm, hi, context)


def evaluate(p: PdInputs, layout: str, n_p: int, n_d: int, pre: ServerModel, dec: ServerModel,
             rate: float) -> Evaluation:
    w = weights(p)
    s1 = sum(wi * s for wi, s in zip(w, pre.prefill_s, strict=True))
    s2 = sum(wi * s * s for wi, s in zip(w, pre.prefill_s, strict=True))
    out = sum(wi * c.output_tokens for wi, c in zip(w, p.classes, strict=True))
    ctx = decode_context(p)
    collocated = layout == "collocated"
    lam_p = rate / n_p
    rho = utilisation(lam_p, s1)
    demand = rate / n_d * out
    batch_max = dec.kv_room_tokens / ctx
    solved = solve_batch(p, dec, demand, 1 - rho if collocated else 1.0, ctx, batch_max) if rho < 1 else None
    batch, step = solved if solved else (None, None)
    itl = None if step is None else step / (1 - rho) if collocated else step
    itl_met = itl is not None and itl <= p.itl_slo_s + _EPS
    xfer = tuple(0.0 for _ in p.classes) if collocated else pre.transfer_s
    extra = step / 2 * (1 - rho) if collocated and step is not None else 0.0  # the decode step under way
    mean_xfer_bytes = sum(wi * c.input_tokens * pre.kv_bytes_per_token for wi, c in zip(w, p.classes, strict=True))
    link_util = 0.0 if collocated else lam_p * mean_xfer_bytes / (
        p.link.bandwidth_gbps * p.link.links * 1e9 / 8)
    if link_util >= 1:
        met = tuple(0.0 for _ in p.classes)
    else:
        met = tuple(mg1_wait_at_most(p.ttft_slo_s + _EPS - s - x - extra, lam_p, s1, s2)
                    for s, x in zip(pre.prefill_s, xfer, strict=True))
    wait = mg1_mean_wait(lam_p, s1, s2)
    mean_ttft = wait + s1 + sum(wi * x for wi, x in zip(w, xfer, strict=True)) + extra
    att = sum(wi * m for wi, m in zip(w, met, strict=True)) if itl_met else 0.0
    gpus = n_p * pre.hardware.tp + (0 if collocated else n_d * dec.hardware.tp)
    return Evaluation(layout, n_p, n_d, pre.hardware, dec.hardware, gpus, rate, pre.prefill_s, xfer,
                      pre.kv_bytes_per_token, s1, s2, rho, wait, met, mean_ttft,
                      link_util, demand, ctx, batch_max, batch, step, itl, itl_met, att, rate * att, rate * att / gpus)


def with_capacity(p: PdInputs, e: Evaluation, pre: ServerModel, dec: ServerModel) -> Evaluation:
    """The largest rate whose attainment reaches the target: attainment only falls as the rate grows
    (longer waits, larger batches), so bisection; above n_p / E[s] the prefill queue is unstable."""
    def ok(rate: float) -> bool:
        return evaluate(p, e.layout, e.prefill_servers, e.decode_servers, pre, dec, rate).attainment >= (
            p.attainment_target - _EPS)

    lo, hi = 0.0, e.prefill_servers / e.mean_prefill_s
    if not ok(hi * 1e-6):
        lo = hi = 0.0
    for _ in range(60):
        if hi - lo <= 1e-9 * max(hi, 1.0):
            break
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return _replace_capacity(e, lo)


def _replace_capacity(e: Evaluation, cap: float) -> Evaluation:
    return replace(e, capacity_rps=cap, capacity_per_gpu=cap / e.gpus)


def _ranked(evals: list[Evaluation]) -> list[Evaluation]:
    """Goodput per GPU at the rate first; splits within 1 % of the best of it (at a light rate every split
    meets the objectives) are told apart by capacity per GPU, the headroom before they stop doing so."""
    if not evals:
        return []
    top = max(e.goodput_per_gpu for e in evals)
    near = [e for e in evals if e.goodput_per_gpu >= top * (1 - _NEAR)]
    rest = [e for e in evals if e.goodput_per_gpu < top * (1 - _NEAR)]
    return (sorted(near, key=lambda e: e.capacity_per_gpu, reverse=True)
            + sorted(rest, key=lambda e: (e.goodput_per_gpu, e.capacity_per_gpu), reverse=True))


def _gain(a: float, b: float) -> float:
    if b <= 0:
        return math.inf if a > 0 else 1.0
    return a / b


def plan_pd(p: PdInputs) -> PdPlan:
    check_inputs(p)
    pre, dec = server_model(p, p.prefill), server_model(p, p.decode)
    splits = []
    for n_p in range(1, p.gpus // p.prefill.tp + 1):
        n_d = (p.gpus - n_p * p.prefill.tp) // p.decode.tp  # every GPU left over decodes
        if n_d >= 1:
            e = evaluate(p, "disaggregated", n_p, n_d, pre, dec, p.rate_rps)
            splits.append(with_capacity(p, e, pre, dec))
    splits = _ranked(splits)
    colloc = []
    for hw in dict.fromkeys((p.prefill, p.decode)):  # collocated on either pool's hardware, all the GPUs
        n = p.gpus // hw.tp
        if n >= 1:
            sm = server_model(p, hw)
            colloc.append(with_capacity(p, evaluate(p, "collocated", n, n, sm, sm, p.rate_rps), sm, sm))
    if not colloc:
        tps = " or ".join(str(t) for t in dict.fromkeys((p.prefill.tp, p.decode.tp)))
        raise ValueError(f"--gpus {p.gpus} holds no server of tp {tps}")
    col = _ranked(colloc)[0]
    best = splits[0] if splits else None
    return _verdict(p, best, col, tuple(splits))


def _verdict(p: PdInputs, best: Evaluation | None, col: Evaluation, splits: tuple[Evaluation, ...]) -> PdPlan:
    if best is None:
        return PdPlan(p, None, col, splits, 0.0, 0.0, "collocate",
                      f"{p.gpus} GPUs hold no prefill server of tp {p.prefill.tp} next to a decode server of tp "
                      f"{p.decode.tp}")
    g_rate = _gain(best.goodput_per_gpu, col.goodput_per_gpu)
    g_cap = _gain(best.capacity_per_gpu, col.capacity_per_gpu)
    split = f"{best.prefill_servers}P:{best.decode_servers}D"
    if g_rate > _TIE and math.isinf(g_rate):
        answer, reason = "disaggregate", f"{split} meets both objectives at this rate; collocated serving for no request"
    elif g_rate > _TIE:
        answer, reason = "disaggregate", f"{split} serves {g_rate:.2f}x the goodput per GPU of collocated serving " \
                                         "at this rate"
    elif g_cap > _TIE:
        answer, reason = "either at this rate", (
            f"both meet the objectives equally at {p.rate_rps:g} req/s; disaggregated keeps {g_cap:.2f}x the "
            "capacity per GPU before the objectives break")
    else:
        answer, reason = "collocate", (
            f"collocated serving reaches {1 / g_rate:.2f}x the disaggregated goodput per GPU at this rate and "
            f"{1 / g_cap if g_cap else math.inf:.2f}x its capacity: disaggregation does not pay here")
    return PdPlan(p, best, col, splits, g_rate, g_cap, answer, reason)
