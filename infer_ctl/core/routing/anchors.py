"""Anchors: where a prompt's text blocks land among a worker's token pages, learned off the hot path. Pure.

A worker's KV events name token pages (core/routing/blocks.py); the router routes on text. Tokenizing
every prompt and hashing its pages before routing costs more than the whole router's budget (measured in
docs/router.md: 0.7 ms for a 2k-token prompt with the simulator's tokenizer, ~10 ms with a real BPE
tokenizer, +1.6 ms for SGLang's SHA-256 chain at page size 1, against an added p50 of 0.3 ms). So the
request path only looks up; the work runs after the routing decision, once per new text:

- the routing text's 64-character block chain (core/routing/index.py `block_hashes`, already computed for
  the predicted index) keys an `Anchor` per block: the prompt's cached units (tokens, or bigrams on an
  EAGLE worker) a worker has when it holds that anchor's block, and that block's SGLang hash;
- `cached_units` finds, per worker, the deepest anchor whose block the worker holds (binary search: a
  radix cache is prefix-closed), plus an anchor for the whole prompt (exactly what an identical
  request would find: SGLang matches at most n - 1 tokens, in whole pages); with tier weights, the
  chain's continuation into host memory (storage) counts at the tier's weight (core/routing/tiers.py);
- `build` tokenizes a prompt as its worker does and hashes its pages with SGLang's chain
  (core/kvevents/hashing.py, the function the simulator publishes with). It resumes from the deepest
  anchor the prompt already has, so a shared prefix is tokenized and hashed once: the next request
  under the same system prompt costs only its own tail.

Which tokens belong to a text block: a token counts once its end, and one character of lookahead after
it, lie inside the block, so the same text prefix always gives the same tokens (tokenizers decide a
piece by its characters plus lookahead; the resumed tokenization is checked against the token before
the resume point and falls back to a full one when it differs). A chat prompt is tokenized in the
worker's template; its blocks are mapped to the worker's text by `ends` (router/kvindex/kv_prompts.py).

Anchors are kept in LRU order, touched leaf-first as in the predicted index, so eviction keeps them
prefix-closed and the binary search valid.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from infer_ctl.core.kvevents.hashing import block_hashes, pack_bigrams, page_digests
from infer_ctl.core.routing.blocks import WorkerBlocks
from infer_ctl.core.routing.index import BLOCK_CHARS


class PromptTokenizer(Protocol):
    def encode_with_ends(self, text: str, start: bool) -> tuple[list[int], list[int]]:
        """Token ids of `text` and each token's end (exclusive character offset). `start`: the text is
        a whole prompt (a tokenizer that adds special tokens adds them then, never to a resumed tail)."""
        ...


@dataclass(slots=True, frozen=True)
class Anchor:
    #: cached prompt units (tokens, or bigram keys) on a worker that holds `block`: whole pages only
    units: int
    #: SGLang's hash of the last whole page (None: no whole page yet, nothing to hold)
    block: int | None
    # -- resuming: what `build` needs to go deeper without tokenizing the prefix again
    digest: bytes | None
    #: tokens after the last whole page, up to the resume point
    tail: tuple[int, ...]
    #: tokens settled up to here, and where in the worker's text tokenizing resumes
    tokens: int
    resume: int
    #: (start, id) of the last settled token: a resumed tokenization must give it again
    check: tuple[int, int] | None


class AnchorTable:
    """The anchors of one page size and keying (bigram or not) under one tokenizer."""

    def __init__(self, page_size: int, *, bigram: bool = False, block_chars: int = BLOCK_CHARS,
                 max_anchors: int = 500_000) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self.bigram = bigram
        self.block_chars = block_chars
        self.max_anchors = max_anchors
        self._blocks: OrderedDict[int, Anchor] = OrderedDict()
        self._full: OrderedDict[int, Anchor] = OrderedDict()
        #: counters: prompts built, of them resumed from an anchor, resumes that failed their check
        self.built = 0
        self.resumed = 0
        self.resume_mismatch = 0

    def __len__(self) -> int:
        return len(self._blocks) + len(self._full)

    # ---- the request path ------------------------------------------------------------------------
    def depth(self, hashes: Sequence[int]) -> int:
        """How many leading text blocks of a prompt have anchors."""
        blocks = self._blocks
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if hashes[mid - 1] in blocks:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def cached_units(self, hashes: Sequence[int], full_key: int, depth: int, held: WorkerBlocks,
                     weight: Callable[[str], float] | None = None) -> int:
        """Prompt units the worker whose blocks are `held` has cached (0 when unknown). With `weight`
        (core/routing/tiers.py TierWeights.of), the tier-weighted score: the device part of the chain,
        plus each lower tier's continuation of it times that tier's weight (rounded down). Without it,
        or when the worker holds nothing below the device, the device part alone."""
        dev, at = self._deepest(hashes, full_key, depth, held.holds, 0)
        tiers = held.tiers(weight) if weight is not None else None
        if not tiers:
            return dev
        score, reached = float(dev), dev
        for w, holds in tiers:
            d, at = self._deepest(hashes, full_key, depth, holds, at)
            if d > reached:
                score += w * (d - reached)
                reached = d
        return int(score)

    def _deepest(self, hashes: Sequence[int], full_key: int, depth: int, holds: Callable[[int], bool],
                 start: int) -> tuple[int, int]:
        """(units, anchors) of the deepest anchor whose block `holds` says is held, the whole prompt's
        first (then anchors = depth); the search starts above `start` anchors, known to be held.
        The search trusts the chain to be prefix-closed (a radix cache is), but first probes the anchor
        right after `start`: a publisher whose pages do not continue the part already matched (a host
        continuation past a gap, a device chain whose start sits on the host) gets (0, start), not a
        jump over the gap to the prompt's last page. One lookup: deeper gaps stay unseen."""
        blocks = self._blocks
        if start < depth:
            nxt = blocks.get(hashes[start])
            if nxt is None or (nxt.block is not None and not holds(nxt.block)):
                return 0, start
        full = self._full.get(full_key)
        if full is not None and (full.block is None or holds(full.block)):
            return full.units, depth
        lo, hi = min(start, depth), depth
        while lo < hi:
            mid = (lo + hi + 1) // 2
            a = blocks.get(hashes[mid - 1])
            if a is not None and (a.block is None or holds(a.block)):
                lo = mid
            else:
                hi = mid - 1
        if not lo:
            return 0, 0
        a = blocks.get(hashes[lo - 1])
        return (a.units if a is not None else 0), lo

    def known(self, full_key: int) -> bool:
        return full_key in self._full

    def prompt_tokens(self, full_key: int) -> int | None:
        """The prompt's length in tokens, when it was anchored before."""
        a = self._full.get(full_key)
        return a.tokens if a is not None else None

    # ---- off the request path --------------------------------------------------------------------
    def build(self, hashes: Sequence[int], full_key: int, text: str, tok: PromptTokenizer,
              ends: Sequence[int] | None = None) -> None:
        """Anchor every text block of a prompt and the whole prompt. `text` is the prompt as the worker
        sees it; `ends[k]` is where in it text block k's knowledge ends (None: block k ends at
        (k + 1) * block_chars, the routing text being the worker's text)."""
        n = len(hashes)
        depth = self.depth(hashes)
        if depth == n and full_key in self._full:
            self._touch(hashes, depth, full_key)
            return
        if ends is None:
            ends = [(k + 1) * self.block_chars for k in range(n)]
        self.built += 1
        base = self._blocks.get(hashes[depth - 1]) if depth else None
        ids: list[int]
        tok_ends: list[int]
        if base is not None and base.tokens:
            start = base.check[0] if base.check else base.resume
            ids, tok_ends = tok.encode_with_ends(text[start:], False)
            tok_ends = [e + start for e in tok_ends]
            if base.check and (not ids or ids[0] != base.check[1] or tok_ends[0] != base.resume):
                self.resume_mismatch += 1
                base = None
            else:
                if base.check:
                    ids, tok_ends = ids[1:], tok_ends[1:]
                self.resumed += 1
        if base is None or not base.tokens:
            base = None
            depth = 0
            ids, tok_ends = tok.encode_with_ends(text, True)
        ps, bigram = self.page_size, self.bigram
        tokens0 = base.tokens if base else 0
        units0 = base.units if base else 0
        seq = list(base.tail) + ids if base else list(ids)
        units = pack_bigrams(seq) if bigram else seq
        pages = len(units) // ps
        digests = page_digests(units[: pages * ps], ps, base.digest if base else None, bigram=bigram) if pages else b""
        page_hashes = block_hashes(digests) if pages else []
        tail0 = len(base.tail) if base else 0
        prev = base
        fresh: list[tuple[int, Anchor]] = []
        i = 0  # new tokens settled so far
        start_of = [tok_ends[j - 1] if j else (prev.resume if prev else 0) for j in range(len(ids))]
        for k in range(depth, n):
            limit = ends[k] - 1  # a token needs one character of lookahead inside the block
            while i < len(ids) and tok_ends[i] <= limit:
                i += 1
            s = tail0 + i  # settled tokens in seq
            a = self._anchor(s, i, seq, units0, tokens0, digests, page_hashes, tok_ends, start_of, ids, prev)
            fresh.append((hashes[k], a))
            prev = a
        total = tokens0 + len(ids)
        full = self._full_anchor(total, units0, digests, page_hashes, prev)
        for key, a in reversed(fresh):  # leaf first: parents end up more recent
            self._blocks[key] = a
            self._blocks.move_to_end(key)
        self._touch(hashes, depth, None)
        self._full[full_key] = full
        self._full.move_to_end(full_key)
        self._evict()

    def _anchor(self, s: int, i: int, seq: list[int], units0: int, tokens0: int, digests: bytes,
                page_hashes: list[int], tok_ends: list[int], start_of: list[int], ids: list[int],
                prev: Anchor | None) -> Anchor:
        ps = self.page_size
        u = max(0, s - 1) if self.bigram else s
        p = u // ps
        if p:
            block: int | None = page_hashes[p - 1]
            digest: bytes | None = digests[(p - 1) * 32 : p * 32]  # page p's digest (no copy of the chain before)
        else:
            block = prev.block if prev else None
            digest = prev.digest if prev else None
        check: tuple[int, int] | None
        if i:
            resume, check = tok_ends[i - 1], (start_of[i - 1], ids[i - 1])
        else:
            resume = prev.resume if prev else 0
            check = prev.check if prev else None
        return Anchor(units0 + p * ps, block, digest, tuple(seq[p * ps : s]), tokens0 + i, resume, check)

    def _full_anchor(self, total: int, units0: int, digests: bytes, page_hashes: list[int],
                     prev: Anchor | None) -> Anchor:
        """What an identical request finds: SGLang matches at most n - 1 of n prompt tokens
        (`Req._compute_max_prefix_len`), n - 2 keys on a bigram tree, in whole pages."""
        ps = self.page_size
        cap = max(0, total - 1 - (1 if self.bigram else 0)) // ps * ps
        p = (cap - units0) // ps  # whole pages of this build under the cap
        if p > 0 and p <= len(page_hashes):
            return Anchor(cap, page_hashes[p - 1], digests[(p - 1) * 32 : p * 32], (), total, 0, None)
        if prev is not None and prev.units <= cap:
            return Anchor(prev.units, prev.block, prev.digest, (), total, 0, None)
        return Anchor(0, None, None, (), total, 0, None)

    def _touch(self, hashes: Sequence[int], depth: int, full_key: int | None) -> None:
        blocks = self._blocks
        for k in range(depth - 1, -1, -1):
            key = hashes[k]
            if key in blocks:
                blocks.move_to_end(key)
        if full_key is not None and full_key in self._full:
            self._full.move_to_end(full_key)

    def _evict(self) -> None:
        while len(self._blocks) > self.max_anchors:
            self._blocks.popitem(last=False)
        while len(self._full) > self.max_anchors // 4:
            self._full.popitem(last=False)


def full_key(hashes: Sequence[int], text: str, block_chars: int) -> int:
    """The key of a whole prompt: its last text block's chain hash and what follows it."""
    return hash((hashes[-1] if hashes else 0, text[len(hashes) * block_chars :], len(text)))
