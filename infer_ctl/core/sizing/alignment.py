"""Does one KV page fill whole RDMA packets and whole CPU/GPU cache lines?

The unit SGLang moves is one page of one layer's buffer on one rank: its PD transfer registers every
layer's K and V buffer separately (MHA: k0..k(L-1) then v0..v(L-1); MLA: one latent buffer per layer)
and sends per-page items of `page_size x row bytes` (`KvBufferDesc.item_len_bytes` in
sglang/srt/mem_cache/memory_pool.py, `kv_item_lens` in disaggregation/mooncake/conn.py, 0.5.23);
runs of contiguous pages are merged into one message (`group_concurrent_contiguous`), so a page that
is a whole number of MTU-size packets makes every message one. The host pool (HiCache) copies pages
too. A page that ends mid-packet or mid-cache-line wastes the tail of the last one on every page.

Pure functions: `plan kv` shows the result; profile validate and launch --dry-run can warn with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infer_ctl.core.sizing.kv import KvShape

# The checklist's 64-byte line (x86-64 CPUs). NVIDIA GPUs have 128-byte L1/L2 lines of four 32-byte
# sectors: pass cache_line=128 to check against those.
CACHE_LINE_BYTES = 64
DEFAULT_MTU = 4096  # the RoCEv2/InfiniBand path MTU the profile defaults to (fabric.mtu)
CANDIDATE_PAGE_SIZES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class PageAlignment:
    page_size: int
    row_bytes: int  # one token, one layer, one buffer (K, V or the MLA latent), one rank
    page_bytes: int  # page_size x row_bytes: the transfer item
    mtu: int
    cache_line: int
    packets: int  # MTU-size packets one page needs
    last_packet_bytes: int  # payload of the last one (== mtu when the page fills them)
    fills_mtu: bool
    fills_cache_lines: bool
    min_page_for_mtu: int  # smallest page size whose pages fill whole packets
    min_page_for_cache_line: int
    min_aligned_page: int  # smallest page size that does both
    aligned_page_sizes: tuple[int, ...]  # the candidates that do both

    @property
    def aligned(self) -> bool:
        return self.fills_mtu and self.fills_cache_lines


def _min_multiple(row_bytes: int, unit: int) -> int:
    # page x row is a multiple of unit  <=>  page is a multiple of unit / gcd(row, unit)
    return unit // math.gcd(row_bytes, unit)


def page_alignment(
    row_bytes: int,
    page_size: int,
    *,
    mtu: int = DEFAULT_MTU,
    cache_line: int = CACHE_LINE_BYTES,
    candidates: tuple[int, ...] = CANDIDATE_PAGE_SIZES,
) -> PageAlignment:
    for name, value in (("row bytes", row_bytes), ("--page-size", page_size), ("--mtu", mtu),
                        ("cache line", cache_line)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    page_bytes = page_size * row_bytes
    packets = -(-page_bytes // mtu)
    for_mtu = _min_multiple(row_bytes, mtu)
    for_line = _min_multiple(row_bytes, cache_line)
    both = math.lcm(for_mtu, for_line)
    return PageAlignment(
        page_size=page_size,
        row_bytes=row_bytes,
        page_bytes=page_bytes,
        mtu=mtu,
        cache_line=cache_line,
        packets=packets,
        last_packet_bytes=page_bytes - (packets - 1) * mtu,
        fills_mtu=page_bytes % mtu == 0,
        fills_cache_lines=page_bytes % cache_line == 0,
        min_page_for_mtu=for_mtu,
        min_page_for_cache_line=for_line,
        min_aligned_page=both,
        aligned_page_sizes=tuple(p for p in candidates if p % both == 0),
    )


def kv_page_alignment(
    shape: KvShape,
    dtype_bytes: int,
    *,
    tp: int,
    page_size: int,
    mtu: int = DEFAULT_MTU,
    cache_line: int = CACHE_LINE_BYTES,
) -> PageAlignment:
    """Alignment of one KV page of `shape` on one of `tp` ranks."""
    return page_alignment(shape.row_bytes(dtype_bytes, tp), page_size, mtu=mtu, cache_line=cache_line)
