"""Tier weights: what a cached token on a lower KV tier (HiCache's host memory, storage) is worth to the
router next to one in HBM. Pure.

A worker's KV events say where each page sits (core/routing/blocks.py: SGLang's StorageMedium, GPU or
CPU_PINNED for the host pool). A host hit is not free: SGLang copies the pages back to HBM before (or
while) the prefill runs. So, as Dynamo's KV router discounts lower tiers, a token counts

    w(medium) = (recompute time saved - load time spent) / recompute time, clamped to [0, 1]

per token (core/sizing/tiers.py `hit_weight`: the load-time model `inferctl plan tiers` uses), HBM = 1.
The load per token is one rank's KV bytes over its PCIe link (host) or the node's read of every rank's
copy, then the host hop (storage); the recompute per token is one over the replica's prefill rate.
Computed once from the router's configuration, never per request.

A prompt's cached prefix is one chain: the part in HBM comes first, the host part continues it (SGLang
matches the device tree, then loads the host pages after it back), storage last. The score of a worker
is device_tokens + w_host x host_tokens + w_storage x storage_tokens (core/routing/anchors.py).
SGLang 0.5.23 publishes no events for its L3 storage tier (only GPU and CPU_PINNED:
mem_cache/unified_cache/unified_tree_core.py), so `storage` weighs a DISK or EXTERNAL medium a
publisher might send.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infer_ctl.core.sizing.tiers import hit_weight, host_seconds_per_token, storage_seconds_per_token

#: SGLang's StorageMedium (disaggregation/kv_events.py): L1 HBM, L2 host pinned memory
DEVICE = "GPU"
HOST = "CPU_PINNED"

# Defaults when the router is not told its workers' numbers (RouterConfig, docs/router.md "KV tiers"):
# Llama-3.1-70B in BF16 on 8 x H100 (the simulator's default prefill): 320 KiB of KV per token over 8
# ranks; 2 x 70.6e9 FLOP per token at 8 x 989 TFLOP/s x MFU 0.5 is ~28,000 tokens/s (sim/timing.py).
DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK = 327_680 // 8
DEFAULT_PREFILL_TOKENS_PER_S = 28_000.0
#: host -> one GPU, effective (`inferctl plan tiers --pcie-gbs`'s default)
DEFAULT_HOST_GB_S = 50.0


@dataclass(frozen=True)
class TierWeights:
    """w(medium) for the media below HBM; HBM is always 1."""

    host: float = 1.0
    storage: float = 1.0

    def __post_init__(self) -> None:
        for name, w in (("host", self.host), ("storage", self.storage)):
            if not 0.0 <= w <= 1.0:
                raise ValueError(f"tier weight {name} must be in [0, 1], got {w:g}")

    @property
    def blind(self) -> bool:
        """Every tier counts as HBM (the score is the plain cached length)."""
        return self.host == 1.0 and self.storage == 1.0

    def of(self, medium: str) -> float:
        if medium == DEVICE:
            return 1.0
        return self.host if medium == HOST else self.storage


#: tier-blind: a token cached anywhere counts as one in HBM
BLIND = TierWeights()


def weights_from(*, kv_bytes_per_token_per_rank: float, prefill_tokens_per_s: float, host_gb_s: float,
                 storage_gb_s: float | None = None, ranks_per_node: int = 1) -> TierWeights:
    """The load-time model's weights. `host_gb_s`: host -> one GPU (each rank copies its own shard);
    `storage_gb_s`: the store's read bandwidth for one node, which reads each of its `ranks_per_node`
    ranks' copies (None: no storage bandwidth known, and a storage token counts 0)."""
    # finite and positive, each named: an infinite rate or bandwidth makes a 0/0 or inf/inf of the
    # weight (NaN would pass every comparison the score makes), an infinite or NaN byte count has no int
    for name, v in (("kv_bytes_per_token_per_rank", kv_bytes_per_token_per_rank),
                    ("prefill_tokens_per_s", prefill_tokens_per_s), ("host_gb_s", host_gb_s),
                    ("storage_gb_s", storage_gb_s), ("ranks_per_node", ranks_per_node)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if kv_bytes_per_token_per_rank < 1 or kv_bytes_per_token_per_rank != int(kv_bytes_per_token_per_rank):
        raise ValueError(f"kv_bytes_per_token_per_rank must be a whole number >= 1, got {kv_bytes_per_token_per_rank}")
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    if not prefill_tokens_per_s > 0:
        raise ValueError(f"prefill_tokens_per_s must be > 0, got {prefill_tokens_per_s:g}")
    if not host_gb_s > 0:
        raise ValueError(f"host_gb_s must be > 0, got {host_gb_s:g}")
    per_rank = int(kv_bytes_per_token_per_rank)
    recompute = 1.0 / prefill_tokens_per_s
    host = host_seconds_per_token(per_rank, host_gb_s * 1e9)
    storage = 0.0
    if storage_gb_s is not None:
        if not storage_gb_s > 0:
            raise ValueError(f"storage_gb_s must be > 0, got {storage_gb_s:g}")
        per_tok = storage_seconds_per_token(per_rank * ranks_per_node, storage_gb_s * 1e9, host)
        storage = hit_weight(per_tok, recompute)
    return TierWeights(host=hit_weight(host, recompute), storage=storage)
