"""KV tiers (SGLang HiCache: GPU HBM, host DRAM, storage): what each holds, and when a hit in it pays.

Capacity: per rank, as SGLang sizes its pools (every rank holds its shard of every cached token, so a
replica's token capacity is one rank's). Host pool: SGLang 0.5.23's own sizing, next to an explicit
--hicache-ratio / --hicache-size. Pays: loading a cached prefix of N tokens from a tier must take less
time than prefilling those N tokens again; the break-even prefix is the shortest (in whole pages) for
which it does. Formulas and sources: docs/sizing.md ("KV tiers").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infer_ctl.core.sizing.kv import KvShape, capacity
from infer_ctl.core.sizing.roofline import prefill_flops
from infer_ctl.core.sizing.transfer import plan_transfer

GIB = 1024**3
# sglang/srt/mem_cache/pool_host/base.py (0.5.23): HICACHE_HOST_MEMORY_RESERVE_BYTES
SGLANG_HOST_RESERVE_BYTES = 10 * GIB
# sglang/srt/mem_cache/hicache_auto_size.py (0.5.23): _ALLOCATION_SLACK_FRACTION
SGLANG_AUTO_SIZE_SLACK = 0.05
# sglang/srt/arg_groups/hicache_hook.py (0.5.23) handle_hicache_ratio_default: 2.0 in "cache" host mode
SGLANG_DEFAULT_RATIO = 2.0
# sglang/srt/arg_groups/fields/memory.py (0.5.23): --hicache-host-memory-fraction default
SGLANG_DEFAULT_HOST_FRACTION = 0.8


def host_budget_per_rank(available_bytes: int, ranks_per_host: int, reserve_bytes: int) -> int:
    """sglang pool_host/base.py host_memory_budget_bytes: (available - 10 GiB) // ranks per host."""
    return (available_bytes - reserve_bytes) // ranks_per_host


def sglang_auto_ratio(device_pool_bytes: int, budget_per_rank: int, fraction: float,
                      requested: float = SGLANG_DEFAULT_RATIO) -> float:
    """sglang hicache_auto_size.py auto_size_hicache: the default ratio, lowered until the host pool
    fits int(budget x fraction) with 5 % slack (the MIN all-reduce over ranks is a no-op here: every
    rank of a uniform replica computes the same)."""
    budget = int(budget_per_rank * fraction)
    return min(requested, budget * (1 - SGLANG_AUTO_SIZE_SLACK) / device_pool_bytes)


def host_pool_tokens(*, device_tokens: int, page_size: int, bytes_per_token: int,
                     ratio: float | None = None, size_gb: int | None = None) -> int:
    """sglang pool_host/base.py HostKVCache.__init__: --hicache-size GB (10^9) // bytes per token, else
    int(device tokens x ratio); then one padding page: (size // page + 1) x page."""
    if size_gb is not None and size_gb > 0:
        size = int(size_gb * 1e9 // bytes_per_token)
    elif ratio is not None:
        size = int(device_tokens * ratio)
    else:
        raise ValueError("host pool needs a ratio or a size")
    return (size // page_size + 1) * page_size


@dataclass(frozen=True)
class HostPool:
    source: str  # "sglang auto-size", "--hicache-ratio", "--hicache-size"
    ratio: float | None  # host/device token ratio (None for a fixed size)
    tokens: int  # per rank = per replica
    bytes_per_rank: int
    bytes_per_host: int
    budget_per_rank: int | None  # what SGLang lets one rank allocate (None: host RAM not given)
    fits: bool | None  # SGLang refuses to start when a pool exceeds the budget
    smaller_than_device: bool  # SGLang warns: L2 cache effectiveness is reduced
    note: str | None = None


@dataclass(frozen=True)
class Compute:
    """Prefill compute of one replica: `flops_per_s` = peak x GPUs x efficiency (MFU)."""

    flops_per_s: float
    params: int  # active parameters per token
    layers: int
    qk_dim: int  # attention heads x query/key width
    v_dim: int  # attention heads x value width

    def seconds(self, tokens: int) -> float:
        flops = prefill_flops(params=self.params, tokens=tokens, layers=self.layers,
                              qk_dim=self.qk_dim, v_dim=self.v_dim)
        return flops / self.flops_per_s


@dataclass(frozen=True)
class TierInputs:
    tp: int
    hbm_bytes_per_gpu: int
    weights_bytes: int  # whole replica; each rank holds weights // tp
    compute: Compute
    page_size: int = 64
    mem_fraction: float = 1.0
    context: int = 8192  # L: tokens of one session
    prefix: int = 8192  # N: the shared prefix whose hit is weighed against recomputing it
    concurrency: int = 0  # sessions active in HBM (their KV is not available for cached prefixes)
    max_prefix: int = 131072  # longest prefix worth considering (the model's context length)
    ranks_per_host: int | None = None  # default: tp (one replica on one node)
    host_available_bytes: int | None = None  # cgroup-visible available host RAM of one node
    host_reserve_bytes: int = SGLANG_HOST_RESERVE_BYTES
    host_memory_fraction: float = SGLANG_DEFAULT_HOST_FRACTION
    hicache_ratio: float | None = None
    hicache_size_gb: int | None = None
    pcie_bytes_s: float = 50e9  # host -> one GPU, effective
    pcie_latency_s: float = 0.0
    storage_bytes: int | None = None
    storage_read_bytes_s: float | None = None  # per node, effective (after the file system)
    storage_latency_s: float = 0.0
    storage_page_overhead_s: float = 0.0  # per page (one file / object per page per rank)
    fabric_bytes_s: float | None = None  # when the store is remote: the NIC path caps the read

    @property
    def ranks_on_host(self) -> int:
        return self.ranks_per_host if self.ranks_per_host is not None else self.tp


@dataclass(frozen=True)
class TierCapacity:
    tier: str  # "hbm", "host", "storage"
    tokens: int
    bytes_per_rank: int | None
    bytes_total: int  # over the replica (host: over its ranks; storage: what the store holds)
    sessions: int  # tokens // context
    prefix_tokens: int  # tokens left for cached prefixes (HBM: minus the active sessions), whole pages


@dataclass(frozen=True)
class TierLoad:
    tier: str
    prefix_tokens: int  # the page-aligned part of the prefix a hit can cover
    load_seconds: float
    recompute_seconds: float
    pays: bool
    load_seconds_per_token: float
    recompute_seconds_per_token: float  # at this prefix (rises with N: attention)
    fixed_seconds: float
    break_even_tokens: int | None  # shortest whole-page prefix whose load beats recomputing it
    never: str | None = None  # why there is no break-even


@dataclass(frozen=True)
class TierPlan:
    kv_bytes_per_token: int  # one copy (plan kv's number)
    kv_bytes_per_token_per_rank: int
    storage_bytes_per_token: int
    read_bytes_per_token_per_node: int
    page_size: int
    device_pool_bytes_per_rank: int
    capacities: list[TierCapacity]
    host_auto: HostPool | None
    host_explicit: HostPool | None
    host_chosen: HostPool | None
    loads: list[TierLoad]
    assumptions: list[str] = field(default_factory=list)


# The inputs hold SI base units; an error names the option, so it shows the value in that option's unit
# (`--storage-gbs -1` must not read "got -1e+09").
_OPTION_UNIT = {"-gb": 1e9, "-gbs": 1e9, "-tb": 1e12, "-us": 1e-6, "-gbps": 1e9 / 8, "-gib": 1024**3}


def _as_given(name: str, value: float) -> float:
    scale = next((s for suffix, s in _OPTION_UNIT.items() if name.endswith(suffix)), 1.0)
    return value / scale


def _check(inp: TierInputs, shape: KvShape | None = None, attention_heads: int | None = None) -> None:
    for name, value in (("--pcie-gbs", inp.pcie_bytes_s), ("--pcie-latency-us", inp.pcie_latency_s),
                        ("--storage-latency-us", inp.storage_latency_s),
                        ("--storage-page-overhead-us", inp.storage_page_overhead_s),
                        ("--mem-fraction", inp.mem_fraction), ("--hicache-ratio", inp.hicache_ratio),
                        ("--hicache-host-memory-fraction", inp.host_memory_fraction),
                        ("--storage-gbs", inp.storage_read_bytes_s), ("--fabric-gbps", inp.fabric_bytes_s),
                        ("prefill FLOP/s (--tflops x --tp x --efficiency)", inp.compute.flops_per_s)):
        # NaN passes every `<` test and inf makes every load free or every recompute free
        if value is not None and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
    if shape is not None and inp.tp >= 1 and (why := shape.tp_error(inp.tp, attention_heads)):
        raise ValueError(why)
    for name, value, low, strict in (
        ("--tp", inp.tp, 1, False),
        ("--hbm-gb", inp.hbm_bytes_per_gpu, 0, True),
        ("--weights-gb", inp.weights_bytes, 0, False),
        ("--page-size", inp.page_size, 1, False),
        ("--context", inp.context, 1, False),
        ("--prefix", inp.prefix, 1, False),
        ("--concurrency", inp.concurrency, 0, False),
        ("--max-prefix", inp.max_prefix, 1, False),
        ("--ranks-per-host", inp.ranks_on_host, 1, False),
        ("--pcie-gbs", inp.pcie_bytes_s, 0, True),
        ("--pcie-latency-us", inp.pcie_latency_s, 0, False),
        ("--storage-latency-us", inp.storage_latency_s, 0, False),
        ("--storage-page-overhead-us", inp.storage_page_overhead_s, 0, False),
        ("prefill FLOP/s (--tflops x --tp x --efficiency)", inp.compute.flops_per_s, 0, True),
    ):
        if value < low or (strict and value == low):
            raise ValueError(f"{name} must be {'>' if strict else '>='} {low}, got {_as_given(name, value):g}")
    for name, opt in (("--host-ram-gb", inp.host_available_bytes), ("--storage-tb", inp.storage_bytes),
                      ("--storage-gbs", inp.storage_read_bytes_s), ("--fabric-gbps", inp.fabric_bytes_s),
                      ("--hicache-ratio", inp.hicache_ratio), ("--hicache-size", inp.hicache_size_gb)):
        if opt is not None and opt <= 0:
            raise ValueError(f"{name} must be > 0, got {_as_given(name, opt):g}")
    if not 0 < inp.mem_fraction <= 1:
        raise ValueError(f"--mem-fraction must be in (0, 1], got {inp.mem_fraction:g}")
    if not 0 < inp.host_memory_fraction <= 1:
        # the same range SGLang's handle_hicache_ratio_default enforces
        raise ValueError(f"--hicache-host-memory-fraction must be in (0, 1], got {inp.host_memory_fraction:g}")
    if inp.hicache_ratio is not None and inp.hicache_size_gb is not None:
        raise ValueError("give --hicache-ratio or --hicache-size, not both (SGLang: the size overrides the ratio)")
    if inp.storage_bytes is not None and inp.storage_read_bytes_s is None:
        raise ValueError("--storage-tb needs --storage-gbs (the store's effective read bandwidth)")


def _host_pool(source: str, inp: TierInputs, *, device_tokens: int, per_rank: int, budget: int | None,
               ratio: float | None = None, size_gb: int | None = None, note: str | None = None) -> HostPool:
    tokens = host_pool_tokens(device_tokens=device_tokens, page_size=inp.page_size, bytes_per_token=per_rank,
                              ratio=ratio, size_gb=size_gb)
    nbytes = tokens * per_rank
    return HostPool(source=source, ratio=ratio, tokens=tokens, bytes_per_rank=nbytes,
                    bytes_per_host=nbytes * inp.ranks_on_host, budget_per_rank=budget,
                    fits=None if budget is None else nbytes <= budget,
                    smaller_than_device=tokens <= device_tokens, note=note)


def _break_even(load_per_token: float, fixed: float, compute: Compute, page: int, max_prefix: int) -> int | None:
    """Shortest whole-page prefix N <= max_prefix with load(N) < recompute(N), or None.

    recompute(N) - load(N) is convex in N and <= 0 at N = 0, so once positive it stays positive:
    bisection over page counts finds the first page count where loading wins."""

    def wins(pages: int) -> bool:
        n = pages * page
        return fixed + load_per_token * n < compute.seconds(n)

    hi = max_prefix // page
    if hi < 1 or not wins(hi):
        return None
    lo = 0  # wins(0) is False: nothing to load, nothing saved
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if wins(mid):
            hi = mid
        else:
            lo = mid
    return hi * page


def host_seconds_per_token(per_rank_bytes: int, pcie_bytes_s: float) -> float:
    """Host -> GPU load time of one token: every rank copies its shard over its own PCIe link, in
    parallel, so one rank's bytes over one link's bandwidth."""
    return plan_transfer(per_rank_bytes, pcie_bytes_s * 8 / 1e9).wire_seconds


def storage_seconds_per_token(read_bytes_per_node: int, read_bytes_s: float, host_per_token: float, *,
                              page_overhead_s: float = 0.0, page_size: int = 1) -> float:
    """Storage -> host pool -> GPU load time of one token: the node's read, then the host hop, one after
    the other (no overlap), plus the backend's per-page cost spread over the page's tokens."""
    read = plan_transfer(read_bytes_per_node, read_bytes_s * 8 / 1e9).wire_seconds
    return read + page_overhead_s / page_size + host_per_token


def hit_weight(load_seconds_per_token: float, recompute_seconds_per_token: float) -> float:
    """What one cached token in a lower tier is worth next to one in HBM (worth 1: it costs nothing to
    use and saves its whole recompute): the recompute it saves minus the load it costs, as a share of
    the recompute, clamped to [0, 1] (a tier slower than recomputing is worth nothing, never less).
    The KV router's tier weights (core/routing/tiers.py)."""
    if not recompute_seconds_per_token > 0 or math.isnan(load_seconds_per_token):
        return 0.0
    w = 1.0 - load_seconds_per_token / recompute_seconds_per_token
    # inf / inf (a rate so small its recompute overflows) is NaN, and max(0.0, nan) is 0.0 only by
    # argument order: say it
    return 0.0 if math.isnan(w) else min(1.0, max(0.0, w))


def _load(tier: str, inp: TierInputs, per_token: float, fixed: float) -> TierLoad:
    page = inp.page_size
    n = inp.prefix // page * page  # HiCache matches and moves whole pages only
    load = fixed + per_token * n if n else 0.0
    recompute = inp.compute.seconds(n) if n else 0.0
    be = _break_even(per_token, fixed, inp.compute, page, inp.max_prefix)
    never = None
    if be is None:
        never = (f"loading is slower than recomputing at every prefix up to {inp.max_prefix:,} tokens"
                 if inp.max_prefix >= page else f"--max-prefix is shorter than one page ({page} tokens)")
    return TierLoad(tier=tier, prefix_tokens=n, load_seconds=load, recompute_seconds=recompute,
                    pays=n > 0 and load < recompute, load_seconds_per_token=per_token,
                    recompute_seconds_per_token=recompute / n if n else 0.0, fixed_seconds=fixed,
                    break_even_tokens=be, never=never)


def plan_tiers(shape: KvShape, dtype_bytes: int, inp: TierInputs, attention_heads: int | None = None) -> TierPlan:
    _check(inp, shape, attention_heads)
    tp, page = inp.tp, inp.page_size
    per_token = shape.bytes_per_token(dtype_bytes)
    per_rank = shape.bytes_per_token_per_rank(dtype_bytes, tp)
    # HBM: one rank's budget (its share of HBM minus its shard of the weights), plan kv's formula per
    # rank; SGLang rounds the device pool down to whole pages (model_executor/pool_configurator.py).
    hbm = capacity(per_rank, context=inp.context, hbm_bytes=inp.hbm_bytes_per_gpu,
                   weights_bytes=inp.weights_bytes // tp, mem_fraction=inp.mem_fraction)
    device_tokens = (hbm.max_tokens or 0) // page * page
    # k/v (or latent) buffers hold size + page_size slots: the bytes auto-sizing scales from
    device_pool_bytes = (device_tokens + page) * per_rank
    capacities = [_capacity("hbm", device_tokens, per_rank, tp, inp, active=inp.concurrency * inp.context)]

    budget = (host_budget_per_rank(inp.host_available_bytes, inp.ranks_on_host, inp.host_reserve_bytes)
              if inp.host_available_bytes is not None else None)
    auto = explicit = None
    if budget is not None and device_tokens > 0:
        ratio = sglang_auto_ratio(device_pool_bytes, budget, inp.host_memory_fraction)
        if ratio <= 0:
            auto = HostPool("sglang auto-size", 0.0, 0, 0, 0, budget, False, True,
                            note="SGLang refuses to start: no host memory is left after the reserve")
        else:
            auto = _host_pool("sglang auto-size", inp, device_tokens=device_tokens, per_rank=per_rank,
                              budget=budget, ratio=ratio,
                              note=None if ratio >= SGLANG_DEFAULT_RATIO
                              else f"ratio lowered from {SGLANG_DEFAULT_RATIO:g} to fit host RAM")
    if device_tokens > 0 and inp.hicache_size_gb is not None:
        explicit = _host_pool("--hicache-size", inp, device_tokens=device_tokens, per_rank=per_rank,
                              budget=budget, size_gb=inp.hicache_size_gb)
    elif device_tokens > 0 and inp.hicache_ratio is not None:
        explicit = _host_pool("--hicache-ratio", inp, device_tokens=device_tokens, per_rank=per_rank,
                              budget=budget, ratio=inp.hicache_ratio)
    chosen = explicit or auto  # an explicit ratio or size turns SGLang's auto-sizing off
    if chosen is not None and chosen.tokens > 0:
        capacities.append(_capacity("host", chosen.tokens, per_rank, tp, inp))

    # Storage keys: one object per page per rank for MHA/GQA (each rank its shard), one per page for
    # MLA (rank-replicated: sglang mem_cache/hicache_storage.py HiCacheFile keys without the tp rank).
    storage_per_token = per_rank if shape.is_mla else per_rank * tp
    # Every rank on the node reads its own copy into its own host pool, MLA included.
    read_per_token_node = per_rank * min(tp, inp.ranks_on_host)
    if inp.storage_bytes is not None:
        tokens = inp.storage_bytes // storage_per_token // page * page
        capacities.append(TierCapacity("storage", tokens, None, tokens * storage_per_token,
                                       tokens // inp.context, tokens))

    # Load paths. Host -> GPU: every rank copies its shard over its own PCIe link, in parallel.
    host_per_tok = host_seconds_per_token(per_rank, inp.pcie_bytes_s)
    # (the host row needs no host capacity: PCIe alone decides whether a host hit pays)
    loads = [_load("hbm", inp, 0.0, 0.0), _load("host", inp, host_per_tok, inp.pcie_latency_s)]
    if inp.storage_read_bytes_s is not None:  # the load needs the bandwidth, not the capacity
        read_bps = inp.storage_read_bytes_s
        if inp.fabric_bytes_s is not None:
            read_bps = min(read_bps, inp.fabric_bytes_s)
        # storage -> host pool -> GPU, one after the other (no overlap of the two hops), plus the
        # per-page cost of the backend (ranks issue their pages in parallel: counted once per page)
        per_tok = storage_seconds_per_token(read_per_token_node, read_bps, host_per_tok,
                                            page_overhead_s=inp.storage_page_overhead_s, page_size=page)
        loads.append(_load("storage", inp, per_tok, inp.storage_latency_s + inp.pcie_latency_s))

    return TierPlan(
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_per_rank=per_rank,
        storage_bytes_per_token=storage_per_token,
        read_bytes_per_token_per_node=read_per_token_node,
        page_size=page,
        device_pool_bytes_per_rank=device_pool_bytes,
        capacities=capacities,
        host_auto=auto,
        host_explicit=explicit,
        host_chosen=chosen,
        loads=loads,
        assumptions=ASSUMPTIONS,
    )


def _capacity(tier: str, tokens: int, per_rank: int, tp: int, inp: TierInputs, active: int = 0) -> TierCapacity:
    left = max(0, tokens - active) // inp.page_size * inp.page_size
    return TierCapacity(tier, tokens, tokens * per_rank, tokens * per_rank * tp, tokens // inp.context, left)


ASSUMPTIONS = [
    "one request alone: no other load or prefill competes for PCIe, storage or compute (under load, "
    "shared storage bandwidth divides between concurrent hits, which makes the storage tier worse)",
    "a hit moves whole pages; the tail of the prefix past the last whole page is recomputed either way",
    "no overlap: a tier's load finishes before the rest of the prompt is computed (SGLang overlaps host "
    "loads with the forward pass layer by layer, so the host-tier time is an upper bound)",
    "storage hits go storage -> host pool -> GPU, one hop after the other",
    "recompute = the prefix's prefill FLOPs / (peak x GPUs x efficiency): its marginal cost inside a "
    "prompt whose weights are read for the rest of it anyway",
    "bandwidths are effective (after protocol, file system and driver overhead), not link rates",
    "host pool sizing is a prefill or collocated server's (a decode server resolves its ratio against "
    "its retraction backup instead); draft-model KV and MLA host dedup are not modelled",
]
