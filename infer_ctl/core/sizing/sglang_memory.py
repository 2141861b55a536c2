"""SGLang 0.5.23's default --mem-fraction-static: the share of each GPU's memory for weights + KV pool.

SGLang derives it when the flag is unset (sglang/srt/arg_groups/memory_hook.py,
handle_gpu_memory_settings and reserve_for_graph_mb, 0.5.23): from the GPU's memory (nvidia-smi
memory.total, in MiB) it picks chunked_prefill_size and the decode CUDA-graph max batch, reserves
MiB for activations and CUDA graphs, and sets round((gpu_mem - reserved) / gpu_mem, 3). This is the
rule for a plain CUDA server as launched by default: no PD disaggregation, no speculative decoding, no
DP attention / DeepEP, decode graphs FULL and prefill graphs BREAKABLE (its CUDA defaults),
post-capture KV sizing off (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING defaults to False), no VLM.
"""

from __future__ import annotations

from dataclasses import dataclass

_MIB = 1 << 20


@dataclass(frozen=True)
class MemFraction:
    fraction: float
    gpu_mem_mib: float
    tp: int
    chunked_prefill_size: int
    decode_graph_max_bs: int
    reserved_mib: float


def _capacity_defaults(gpu_mem_mib: float, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max_bs) by memory band, as SGLang picks them."""
    gib = gpu_mem_mib / 1024
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 4096, 48 if tp < 4 else 160
    if gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gib < 160:  # H100 / A100 80 GB and H20 / H200 bands: the same numbers
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def _prefill_graph_sizes(max_bs: int) -> int:
    """How many token counts SGLang captures prefill graphs for (cuda_graph_hook.py,
    generate_prefill_cuda_graph_batch_sizes)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_bs + 1, 512)]
    return sum(1 for s in sizes if s <= max_bs)


def sglang_mem_fraction_static(gpu_mem_bytes: float, tp: int = 1, *, mla: bool = False,
                               model: str = "") -> MemFraction:
    """SGLang's default mem_fraction_static for one GPU of `gpu_mem_bytes` in a TP `tp` server."""
    if gpu_mem_bytes <= 0:
        raise ValueError(f"GPU memory must be positive, got {gpu_mem_bytes:g} bytes")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    mem = gpu_mem_bytes / _MIB
    chunk, decode_bs = _capacity_defaults(mem, tp)
    # prefill graphs up to the chunk (MLA capped at 8192 tokens; Llama-2 paths at 4096)
    prefill_bs = min(8192, chunk) if mla else chunk
    if "llama-2" in model.lower():
        prefill_bs = min(prefill_bs, 4096)
    graphs = decode_bs * 2 + (1.5 * 1024 if mla else _prefill_graph_sizes(prefill_bs) * 8)
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + graphs
    if mem > 60 * 1024:  # SGLang's floor; with the 8k chunk above 60 GiB the sum already exceeds it
        reserved = max(reserved, 10 * 1024)
    return MemFraction(round((mem - reserved) / mem, 3), mem, tp, chunk, decode_bs, reserved)
