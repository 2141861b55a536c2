"""`KvRouting.lookup` (the request path's first-sight check and exact lookup in one pass) against the
two steps it replaced, re-implemented here as they were (`anchor_first_sight`, then `cached`): the same
cached units per candidate, the same full key, the same anchoring and first-sight counts, over fleets
mixing page sizes, bigram (EAGLE) key spaces, a worker whose stream is not exact, several streams, host
tiers, chat / text / ids prompts, candidates that are only some of the exact workers, a spent budget and
the anchoring thread holding the lock.

Real: KvRouting, its anchor tables, the simulator's tokenizer, WorkerBlocks; the streams are stand-ins
(a state and the blocks a worker's events would have stored)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from infer_ctl.core.routing.anchors import full_key
from infer_ctl.core.routing.index import block_hashes
from infer_ctl.core.routing.prompt import routing_text
from infer_ctl.core.routing.tiers import TierWeights
from infer_ctl.router.kvindex.kv_anchoring import HOLD_CHARS, prompt_kind
from infer_ctl.router.kvindex.kv_prompts import PromptView, SimBuiltin
from infer_ctl.router.kvindex.kv_routing import KvRouting, WorkerKv
from tests.router.conftest import new_kv_routing, new_worker_blocks

BLOCK = 64
#: url: (page size, bigram, stream states)
WORKERS: dict[str, tuple[int, bool, tuple[str, ...]]] = {
    "http://a": (1, False, ("exact",)),
    "http://b": (16, False, ("exact",)),
    "http://c": (1, True, ("exact",)),  # EAGLE: bigram keys
    "http://d": (16, False, ("untrusted",)),  # its stream is not exact
    "http://e": (4, False, ("exact", "exact")),  # two streams (DP ranks)
    "http://f": (1, False, ("exact",)),  # a second worker in a's key space
    "http://g": (8, False, ("exact",)),  # joined after the router anchored: no table of its space yet
}
#: joined after the router anchored the prompts it knows
LATE = "http://g"


def old_lookup(kv: KvRouting, endpoint: str, body: dict[str, Any], text: str, hashes: Sequence[int],
               urls: Sequence[str], threshold: float) -> tuple[dict[str, int], int]:
    """picker.py `_exact` before KvRouting.lookup: `anchor_first_sight`, then `cached`, as they were."""
    # anchor_first_sight (and the old Anchoring.first_sight's check)
    if not (kv.first_sight_budget <= 0 or kv.view is None or len(hashes) < 2 or len(text) > HOLD_CHARS):
        exact = [w for w in kv.workers.values() if w.exact]
        if any(s.blocks.device for w in exact for s in w.streams):
            kind = prompt_kind(endpoint, body)
            keys = kv.anchoring.keys(kind, body, hashes)
            need = max(1, int(threshold * len(hashes)))
            if not all(kv.anchoring.table(w.space(), kind).depth(keys) >= need for w in exact):
                # the budgeted build (its own check again, the same as the line above: it builds)
                kv.anchoring.first_sight(endpoint, body, text, hashes, full_key(hashes, text, kv.block_chars), kind,
                                         keys, [w.space() for w in exact], threshold, {})
    # cached(hashes, text, urls, kind, body), weighted
    kind = kv.kind(endpoint, body)
    fk = full_key(hashes, text, kv.block_chars)
    keys = kv.keys(kind, body, hashes)
    out: dict[str, int] = {}
    if kv.view is None:
        return out, fk
    depths: dict[tuple[int, bool], int] = {}
    for url in urls:
        w = kv.workers.get(url)
        if w is None or not w.exact:
            continue
        space = (w.page_size, w.bigram)
        t = kv.tables.get((*space, kind))
        if t is None:
            out[url] = 0
            continue
        d = depths.get(space)
        if d is None:
            d = depths[space] = t.depth(keys)
        out[url] = max((t.cached_units(keys, fk, d, s.blocks, kv._weight) for s in w.streams), default=0)
    return out, fk


def _prompts(rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    words = ["the", "mill", "river", "operator", "runbook", "restart", "fleet", "page", "host", "tier", "anchor"]

    def para(n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    base = [para(120) for _ in range(3)]
    out: list[tuple[str, dict[str, Any]]] = []
    for b in base:
        out.append(("/generate", {"text": b}))
        out.append(("/generate", {"text": b + " " + para(40)}))  # shares b's prefix
        out.append(("/v1/completions", {"prompt": b[: len(b) // 2] + para(30)}))
        sys_msg = {"role": "system", "content": b}
        out.append(("/v1/chat/completions", {"messages": [sys_msg, {"role": "user", "content": para(20)}]}))
        out.append(("/v1/chat/completions", {"messages": [sys_msg, {"role": "user", "content": para(25)},
                                                          {"role": "assistant", "content": para(10)}]}))
    out.append(("/generate", {"input_ids": [rng.randrange(1000) for _ in range(400)]}))
    out.append(("/generate", {"text": "tiny"}))  # one block: never first-sighted
    out.append(("/generate", {"text": para(20) + "x" * (HOLD_CHARS + 10)}))  # held: never on the request path
    return out


def _fleet(tiers: bool, late: bool = True) -> KvRouting:
    kv = new_kv_routing(tier_weights=TierWeights(host=0.5, storage=0.25) if tiers else None)
    kv.view = PromptView(SimBuiltin(), name="sim builtin")
    for url, (ps, bg, states) in WORKERS.items():
        if url == LATE and not late:
            continue
        streams = [SimpleNamespace(state=st, blocks=new_worker_blocks()) for st in states]
        kv.workers[url] = WorkerKv(url, streams, ps, bg, ())  # type: ignore[arg-type]
    return kv


def _anchor_blocks(kv: KvRouting, endpoint: str, body: dict[str, Any]) -> dict[tuple[int, bool], list[int]]:
    """Per key space, the blocks of a prompt's anchors in chain order (what its worker's stores hold)."""
    text = routing_text(endpoint, body)
    hashes = block_hashes(text, BLOCK)
    fk = full_key(hashes, text, kv.block_chars)
    kv.anchoring.build(endpoint, body, text, hashes, fk)
    kind = prompt_kind(endpoint, body)
    keys = kv.keys(kind, body, hashes)
    out: dict[tuple[int, bool], list[int]] = {}
    for (ps, bg, k), t in kv.tables.items():
        if k != kind:
            continue
        chain = [a.block for i in range(len(keys)) if (a := t._blocks.get(keys[i])) is not None and a.block is not None]
        full = t._full.get(fk)
        out[(ps, bg)] = chain + ([full.block] if full is not None and full.block is not None else [])
    return out


def _anchors(kv: KvRouting) -> dict[tuple[int, bool, str], int]:
    return {k: len(t) for k, t in kv.tables.items() if len(t)}


@pytest.mark.parametrize("seed", range(6))
def test_lookup_answers_as_the_first_sight_check_then_cached_did(seed: int) -> None:
    rng = random.Random(seed)
    tiers = seed % 2 == 1
    prompts = _prompts(rng)
    old, new = _fleet(tiers, late=False), _fleet(tiers, late=False)
    # what the workers hold, from prompts this router anchored (`known`) or never saw (reached the
    # workers past it): block ids from a scratch router with the same key spaces
    scratch = _fleet(tiers)
    known = set(rng.sample(range(len(prompts)), 4))
    for i, (endpoint, body) in enumerate(prompts):
        text = routing_text(endpoint, body)
        if len(text) > HOLD_CHARS:
            continue
        for kv in (old, new):
            if i in known:
                _anchor_blocks(kv, endpoint, body)
    for kv in (old, new):
        ps, bg, states = WORKERS[LATE]
        streams = [SimpleNamespace(state=st, blocks=new_worker_blocks()) for st in states]
        kv.workers[LATE] = WorkerKv(LATE, streams, ps, bg, ())  # type: ignore[arg-type]
    for endpoint, body in prompts:
        text = routing_text(endpoint, body)
        if len(text) > HOLD_CHARS:
            continue
        chains = _anchor_blocks(scratch, endpoint, body)
        for url, w in scratch.workers.items():
            for j in range(len(w.streams)):
                if rng.random() < 0.5:
                    continue
                chain = chains.get(w.space(), [])
                cut = rng.randint(0, len(chain))
                host = rng.randint(cut, len(chain)) if tiers else cut
                for kv in (old, new):
                    blocks = kv.workers[url].streams[j].blocks
                    blocks._store(blocks._set("GPU"), chain[:cut])
                    if host > cut:
                        blocks._store(blocks._set("CPU_PINNED"), chain[cut:host])
                    blocks._tiers = None
    every = list(WORKERS)  # d among them: a candidate whose stream is not exact
    held = 0
    for step in range(150):
        endpoint, body = prompts[rng.randrange(len(prompts))]
        text = routing_text(endpoint, body)
        hashes = block_hashes(text, BLOCK)
        urls = rng.sample(every, rng.randint(1, len(every)))
        threshold = rng.choice([0.0, 0.3, 0.5, 0.9, 1.0])
        # refused first sights while prompts are still unanchored, then any
        mode = ("spent", "locked")[step % 2] if step < 10 else rng.choice(["budget", "budget", "spent", "locked", "off"])
        got = []
        for kv, fn in ((old, old_lookup), (new, KvRouting.lookup)):
            kv.first_sight_budget = {"spent": 1e-12, "off": 0.0}.get(mode, 10.0)
            # the bucket as the mode says, whatever time passed: it refills with the clock, and each fleet
            # read the clock at its own moment (a spent bucket that refilled past 0 in one of them only)
            kv.anchoring._budget = -1.0 if mode == "spent" else kv.first_sight_budget
            locked = mode == "locked" and kv.anchoring._lock.acquire()
            try:
                got.append(fn(kv, endpoint, body, text, hashes, urls, threshold))
            finally:
                if locked:
                    kv.anchoring._lock.release()
        assert got[0] == got[1], (seed, step, endpoint, mode, threshold, urls)
        held += any(got[1][0].values())
        assert _anchors(old) == _anchors(new), (seed, step)
        counts = [{k: v for k, v in kv.first_sight.items() if k != "seconds"} for kv in (old, new)]
        assert counts[0] == counts[1], (seed, step, mode)
    # the comparison saw first sights that anchored and ones refused, and cached units found
    assert new.first_sight["anchored"] > 0 and new.first_sight["over_budget"] > 0 and held > 0
