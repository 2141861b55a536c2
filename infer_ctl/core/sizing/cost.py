"""Cost per million tokens from what the hardware costs per hour and what it serves per hour.

    hourly     = sum over pools of nodes x $/node-hour
    tokens/h   = tokens/s x 3600 x utilisation            (idle hours are paid too)
    input $/M  = prefill's share of hourly / (uncached + r x cached input tokens/h) x 10^6; cached: r x that
    output $/M = decode's share of hourly / output tokens/h x 10^6
    all-in $/M output = hourly / output tokens/h x 10^6  (the number architecture tables quote)

Prefill's share is the prefill pool's cost when disaggregated, and the share of GPU time spent in
prefill when collocated. Throughput is measured (a `bench --json` summary), given, or estimated here
from the roofline (decode) and prefill FLOPs (prefill). Sources and worked examples: docs/sizing.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from infer_ctl.core.sizing import presets
from infer_ctl.core.sizing.kv import capacity, shape_of
from infer_ctl.core.sizing.roofline import plan_roofline, prefill_flops
from infer_ctl.core.sizing.spec import speedup

ROLES = ("collocated", "prefill", "decode")


@dataclass(frozen=True)
class Pool:
    role: str  # collocated | prefill | decode
    nodes: int
    gpus_per_node: int
    node_hour_usd: float
    accelerator: str = "h100-sxm"  # preset, for the roofline estimate
    tp: int = 8  # GPUs per replica

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def hourly_usd(self) -> float:
        return self.nodes * self.node_hour_usd

    @property
    def replicas(self) -> int:
        return self.gpus // self.tp


def node_hour_price(*, gpus_per_node: int, node_hour_usd: float | None = None,
                    gpu_hour_usd: float | None = None) -> float:
    """A node's lease per hour, priced per node or per GPU: the one conversion (plan cost, the router)."""
    if node_hour_usd is not None and gpu_hour_usd is None:
        return node_hour_usd
    if gpu_hour_usd is not None and node_hour_usd is None:
        return gpu_hour_usd * gpus_per_node
    raise ValueError("give a price per node-hour or per GPU-hour, exactly one")


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 1024  # per request, cached included
    output_tokens: int = 1024
    cache_hit_rate: float = 0.0  # cached / prompt tokens
    batch: int = 64  # decode sequences per replica (capped by what fits in HBM)


@dataclass(frozen=True)
class Speculative:
    alpha: float  # per-token acceptance rate
    gamma: int  # draft tokens per verification
    cost_ratio: float  # draft step / target step


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    pools: tuple[Pool, ...]
    model: str | None = "llama-3.1-70b"
    workload: Workload = field(default_factory=Workload)
    spec: Speculative | None = None
    prefill_mfu: float = 0.5  # achieved / peak FLOPs in prefill
    decode_bw_efficiency: float = 0.7  # achieved / roofline decode tokens/s
    utilisation: float = 0.7  # share of paid hours serving at the throughput below
    cached_price_ratio: float = 0.1  # a cached input token's price / an uncached one's
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    mem_fraction: float = 0.85

    @property
    def layout(self) -> str:
        return "collocated" if any(p.role == "collocated" for p in self.pools) else "disaggregated"


@dataclass(frozen=True)
class Throughput:
    input_tokens_s: float  # prompt tokens per second, cached included
    output_tokens_s: float
    cache_hit_rate: float
    source: str  # "roofline", "given", "bench <file>"
    prefill_share: float | None = None  # collocated: share of GPU time in prefill
    bottleneck: str | None = None  # disaggregated: the pool that limits the request rate
    decode_batch: int | None = None  # per replica, after the HBM cap
    decode_tokens_s_per_replica: float | None = None
    prefill_seconds_per_request: float | None = None


@dataclass(frozen=True)
class CostPlan:
    hourly_usd: float
    prefill_hourly_usd: float | None  # the part billed to input tokens
    decode_hourly_usd: float | None  # the part billed to output tokens
    input_tokens_per_hour: float
    cached_tokens_per_hour: float
    output_tokens_per_hour: float
    usd_per_m_input: float | None  # uncached
    usd_per_m_cached_input: float | None
    usd_per_m_output: float | None
    usd_per_m_output_all_in: float
    usd_per_m_tokens_all_in: float  # hourly / (input + output tokens)


def check_scenario(s: Scenario) -> None:
    """One message per bad value, named as the CLI option that sets it."""
    if not s.pools:
        raise ValueError("no pools: give --pool ROLE:nodes=N,gpus=G,node_hour=USD")
    roles = {p.role for p in s.pools}
    if "collocated" in roles and roles != {"collocated"}:
        raise ValueError("--pool: a collocated pool cannot be mixed with prefill/decode pools")
    if roles != {"collocated"} and roles != {"prefill", "decode"}:
        raise ValueError("--pool: a disaggregated deployment needs both a prefill and a decode pool")
    for p in s.pools:
        if p.role not in ROLES:
            raise ValueError(f"--pool role must be one of {', '.join(ROLES)}, got {p.role!r}")
        for key, value in (("nodes", p.nodes), ("gpus", p.gpus_per_node), ("tp", p.tp)):
            if value < 1:
                raise ValueError(f"--pool {p.role}:{key} must be >= 1, got {value}")
        if p.node_hour_usd < 0:
            raise ValueError(f"--pool {p.role}:node_hour (cost per node-hour) must be >= 0, got {p.node_hour_usd:g}")
    if s.model is not None:
        presets.model_preset(s.model)  # unknown names fail here, with the closest match
    for p in s.pools:
        presets.accelerator_preset(p.accelerator)
    presets.dtype_bytes(s.weight_dtype)
    presets.dtype_bytes(s.kv_dtype)
    if not 0 < s.mem_fraction <= 1:
        raise ValueError(f"--mem-fraction must be in (0, 1], got {s.mem_fraction:g}")
    if s.spec is not None:
        if not 0 <= s.spec.alpha <= 1:
            raise ValueError(f"--spec-alpha must be in [0, 1], got {s.spec.alpha:g}")
        if s.spec.gamma < 0:
            raise ValueError(f"--spec-gamma must be >= 0, got {s.spec.gamma}")
        if s.spec.cost_ratio < 0:
            raise ValueError(f"--spec-cost-ratio must be >= 0, got {s.spec.cost_ratio:g}")
    if not 0 < s.utilisation <= 1:
        raise ValueError(f"--utilisation must be in (0, 1], got {s.utilisation:g}")
    if not 0 <= s.cached_price_ratio <= 1:
        raise ValueError(f"--cached-price-ratio must be in [0, 1], got {s.cached_price_ratio:g}")
    w = s.workload
    if not 0 <= w.cache_hit_rate < 1:
        raise ValueError(f"--cache-hit-rate must be in [0, 1), got {w.cache_hit_rate:g}")
    for name, value in (("--prompt-tokens", w.prompt_tokens), ("--output-tokens", w.output_tokens),
                        ("--batch", w.batch)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    for name, eff in (("--prefill-mfu", s.prefill_mfu), ("--decode-efficiency", s.decode_bw_efficiency)):
        if not 0 < eff <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {eff:g}")


def estimate_throughput(s: Scenario) -> Throughput:
    """Requests per second the pools sustain, from prefill FLOPs and the decode roofline."""
    check_scenario(s)
    if s.model is None:
        raise ValueError("the roofline estimate needs --model (or measured throughput: --bench FILE)")
    m = presets.model_preset(s.model)
    w = s.workload
    wbytes, kvbytes = presets.dtype_bytes(s.weight_dtype), presets.dtype_bytes(s.kv_dtype)
    cached = round(w.prompt_tokens * w.cache_hit_rate)
    qk = m.attention_heads * (m.qk_head_dim or m.head_dim)
    v = m.attention_heads * m.head_dim

    def prefill_s(pool: Pool) -> float:
        acc = presets.accelerator_preset(pool.accelerator)
        # only the uncached suffix is computed; it still attends to the cached prefix
        work = (prefill_flops(params=m.flops_params, tokens=w.prompt_tokens, layers=m.layers, qk_dim=qk, v_dim=v)
                - prefill_flops(params=m.flops_params, tokens=cached, layers=m.layers, qk_dim=qk, v_dim=v))
        return work / (acc.fp16_tflops * 1e12 * pool.tp * s.prefill_mfu)

    def decode(pool: Pool) -> tuple[int, float]:
        acc = presets.accelerator_preset(pool.accelerator)
        per_token = shape_of(m).bytes_per_token(kvbytes)
        fit = capacity(per_token, context=w.prompt_tokens + w.output_tokens,
                       hbm_bytes=int(acc.hbm_gb * 1e9 * pool.tp), weights_bytes=m.params * wbytes,
                       mem_fraction=s.mem_fraction).max_concurrent or 0
        batch = min(w.batch, fit)
        if batch < 1:
            raise ValueError(f"--pool {pool.role}: one request of {w.prompt_tokens + w.output_tokens:,} tokens "
                             f"does not fit next to the weights in {pool.tp} x {acc.name}")
        roof = plan_roofline(params=m.params, weight_dtype_bytes=wbytes, peak_tflops=acc.fp16_tflops,
                             hbm_tb_s=acc.hbm_tb_s, gpus=pool.tp, batch=batch, kv_bytes_per_token=per_token,
                             context=w.prompt_tokens + w.output_tokens // 2)
        gain = speedup(s.spec.alpha, s.spec.gamma, s.spec.cost_ratio) if s.spec else 1.0
        return batch, roof.tokens_per_s * s.decode_bw_efficiency * gain

    for p in s.pools:
        if p.replicas < 1:
            raise ValueError(f"--pool {p.role}: {p.gpus} GPUs make no replica of tp={p.tp}")
    if s.layout == "collocated":
        pool = s.pools[0]
        reps = sum(p.replicas for p in s.pools)
        t_p = prefill_s(pool)
        batch, d_tps = decode(pool)
        t_d = w.output_tokens / d_tps  # batch-time one request's output takes
        rate = reps / (t_p + t_d)
        return Throughput(rate * w.prompt_tokens, rate * w.output_tokens, w.cache_hit_rate, "roofline",
                          prefill_share=t_p / (t_p + t_d), decode_batch=batch,
                          decode_tokens_s_per_replica=d_tps, prefill_seconds_per_request=t_p)
    pre = [p for p in s.pools if p.role == "prefill"]
    dec = [p for p in s.pools if p.role == "decode"]
    r_p = sum(p.replicas / prefill_s(p) for p in pre)
    decodes = [decode(p) for p in dec]
    r_d = sum(p.replicas * tps / w.output_tokens for p, (_, tps) in zip(dec, decodes, strict=True))
    rate = min(r_p, r_d)
    return Throughput(rate * w.prompt_tokens, rate * w.output_tokens, w.cache_hit_rate, "roofline",
                      bottleneck="prefill" if r_p < r_d else "decode", decode_batch=decodes[0][0],
                      decode_tokens_s_per_replica=decodes[0][1], prefill_seconds_per_request=prefill_s(pre[0]))


def plan_cost(s: Scenario, tp: Throughput) -> CostPlan:
    check_scenario(s)
    for name, value in (("input tokens/s", tp.input_tokens_s), ("output tokens/s", tp.output_tokens_s)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value:g}")
    if tp.output_tokens_s == 0:
        raise ValueError("output tokens/s is 0: nothing to put a price on")
    if not 0 <= tp.cache_hit_rate <= 1:
        raise ValueError(f"cache hit rate must be in [0, 1], got {tp.cache_hit_rate:g}")
    hourly = sum(p.hourly_usd for p in s.pools)
    if s.layout == "disaggregated":
        c_in: float | None = sum(p.hourly_usd for p in s.pools if p.role == "prefill")
    else:
        c_in = None if tp.prefill_share is None else hourly * tp.prefill_share
    c_out = None if c_in is None else hourly - c_in
    hours = 3600 * s.utilisation
    inp, out = tp.input_tokens_s * hours, tp.output_tokens_s * hours
    cached = inp * tp.cache_hit_rate
    billable = (inp - cached) + s.cached_price_ratio * cached
    per_in = None if c_in is None or billable == 0 else c_in / billable * 1e6
    return CostPlan(
        hourly_usd=hourly,
        prefill_hourly_usd=c_in,
        decode_hourly_usd=c_out,
        input_tokens_per_hour=inp,
        cached_tokens_per_hour=cached,
        output_tokens_per_hour=out,
        usd_per_m_input=per_in,
        usd_per_m_cached_input=None if per_in is None else per_in * s.cached_price_ratio,
        usd_per_m_output=None if c_out is None else c_out / out * 1e6,
        usd_per_m_output_all_in=hourly / out * 1e6,
        usd_per_m_tokens_all_in=hourly / (inp + out) * 1e6,
    )


_H100 = "h100-sxm"
_H100_NODE_HOUR = 8 * 2.50  # illustrative lease prices: $2.50 / H100-hour, $3.50 / H200-hour
_H200_NODE_HOUR = 8 * 3.50
_DISAGG = (
    Pool("prefill", nodes=2, gpus_per_node=8, node_hour_usd=_H100_NODE_HOUR, accelerator=_H100),
    Pool("decode", nodes=6, gpus_per_node=8, node_hour_usd=_H200_NODE_HOUR, accelerator="h200"),
)

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "collocated",
            "one 8x H100 node, prefill and decode on the same GPUs; the decode batch stays small because "
            "prefill chunks share every step (ITL)",
            pools=(Pool("collocated", nodes=1, gpus_per_node=8, node_hour_usd=_H100_NODE_HOUR, accelerator=_H100),),
            workload=Workload(batch=32),
        ),
        Scenario(
            "disaggregated",
            "2 x 8x H100 prefill nodes + 6 x 8x H200 decode nodes (the reference profile's shape); decode "
            "runs large batches undisturbed",
            pools=_DISAGG,
            workload=Workload(batch=128),
        ),
        Scenario(
            "disagg-spec-radix",
            "the disaggregated pools with EAGLE3-style speculative decoding and a radix (prefix) cache hit rate",
            pools=_DISAGG,
            workload=Workload(batch=128, cache_hit_rate=0.5),
            spec=Speculative(alpha=0.7, gamma=3, cost_ratio=0.05),
        ),
        Scenario("custom", "nothing preset: give --pool and a throughput source", pools=(), model=None),
    )
}


def scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"unknown --scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def with_workload(s: Scenario, **changes: float | int | None) -> Scenario:
    kept: dict[str, Any] = {k: v for k, v in changes.items() if v is not None}
    return replace(s, workload=replace(s.workload, **kept)) if kept else s
