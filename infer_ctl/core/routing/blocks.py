"""The exact index: which KV blocks each worker holds, as its own KV events say. Pure.

SGLang 0.5.23 (`--kv-events-config`) publishes every change of a worker's radix cache as events
(sglang/srt/disaggregation/kv_events.py): `BlockStored` (the block hashes of new pages, the hash of the
page they continue, their token ids, the page size, the storage medium), `BlockRemoved` (evicted pages)
and `AllBlocksCleared` (a flush or a start). A block hash names a page *and everything before it* (the
page hash chain, core/kvevents/hashing.py), so "worker w holds block h" means "w has this whole prefix
cached": a prompt is matched by hashing its pages and asking for the deepest hash a worker holds.

`WorkerBlocks.apply` takes one decoded batch's events (the msgpack maps as plain Python objects) and
refuses what it cannot trust without changing anything: a malformed or unknown event, a list longer than
`max_event_blocks`, a store under a parent the worker never stored (the stream lost something), more
blocks than `max_blocks` (bounded memory whatever a publisher sends). The caller then stops trusting the
stream (router/kvindex/kv_subscriber.py). The medium is kept per block (SGLang's StorageMedium: GPU,
CPU_PINNED, ...): `holds` reads the device, `tiers` the lower media for the tier-weighted score
(core/routing/tiers.py, core/routing/anchors.py).

`max_blocks` bounds the distinct blocks a worker holds, on any medium: with HiCache a page in HBM and
backed up to host (SGLang's write_through stores it once per medium, same hash) is one block, so the
bound reads as the worker's cache in pages whatever its write policy. Each medium has its own set, so the
memory is at most one entry per medium a block is on: 2 x `max_blocks` for SGLang (GPU and CPU_PINNED
only), 4 x for a publisher naming all of MEDIA. `max_blocks_per_medium` bounds each medium's set on its
own (None: `max_blocks`): a batch that would pass it is refused whole like one over `max_blocks`, and
its blocks on that medium are counted in `refused` (the metric of refused blocks by medium).

Each medium's blocks are a `BlockTable` (core/routing/blocktable.py): the hashes in an `array('q')`, no
Python object per block, 16-27 bytes an entry (a dict of ints was ~100: 3.2M entries in four media 323
MB, issue 28), so a stream holds at most ~27 B x (max_blocks + the lower media's caps). Nothing in it
is tracked by the cyclic garbage collector (a set of 3.2M ints was: a 375 ms full-GC pass). Its bulk
operations loop in Python (~0.2-0.5 us a hash): `apply_steps` slices them, and grows a table in slices
too (`BlockTable.reserve`).

`apply_steps` applies a batch in slices of `step_blocks` hashes, yielding between them, so the caller
can let its event loop run: one set update of 800,000 hashes held a loaded 2-core host's loop 0.8-1.6 s
(issue 28 item 2). Readers may see a batch half applied: stores arrive in chain order, so what is held
stays a prefix of each chain; a `clear` meanwhile ends the batch (`_epoch`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

from infer_ctl.core.routing.blocktable import BlockTable, member

#: SGLang's StorageMedium.GPU; an event without a medium (SGLang omits a None field) is on the device
DEVICE = "GPU"
#: every StorageMedium value (SGLang 0.5.23 disaggregation/kv_events.py: GPU, CPU_PINNED, DISK, EXTERNAL).
#: Another string is refused: each medium gets its own set, so a publisher free to name media could grow
#: the index without storing one block.
MEDIA = frozenset({DEVICE, "CPU_PINNED", "DISK", "EXTERNAL"})
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


class EventRejected(Exception):
    """A batch the index cannot apply; `kind` labels the metric (malformed, unknown_event, oversized,
    orphan, capacity)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class BatchEffect:
    stored: int = 0
    removed: int = 0
    cleared: bool = False
    #: the page size and bigram keying seen in the stores (None: no store in the batch)
    block_size: int | None = None
    bigram: bool | None = None
    #: removals of blocks the index did not hold (SGLang never sends them; counted, not fatal)
    unknown_removed: int = 0


#: hashes per slice of `apply_steps`. Each hash is a lookup (and an insert) in tables of up to millions
#: of entries, far over the CPU's caches, and a lookup in each other medium's when it is new: ~0.4-1.6 us
#: a hash with dicts once a medium held 250,000-800,000 blocks (a quiet 2-core host), so 50,000 a slice
#: held the loop 20-80 ms every slice of a flood's batch (issue 28 item 2); 8,192 is ~3-13 ms (~1.5x that
#: with BlockTables' Python loops), and the loop turns a slice costs are noise next to it
STEP_BLOCKS = 8_192


def _hashes(ev: dict[str, Any], limit: int) -> list[int]:
    hashes = ev.get("block_hashes")
    if not isinstance(hashes, list):
        raise EventRejected("malformed", f"{ev.get('type')}: block_hashes is not a list")
    if len(hashes) > limit:
        raise EventRejected("oversized", f"{ev.get('type')}: {len(hashes)} block hashes (limit {limit})")
    # the types' set at C speed (a Python loop held the event loop ~0.7 s for 1.7M hashes); bool is its
    # own type, so True is refused too
    if not set(map(type, hashes)) <= {int}:
        raise EventRejected("malformed", f"{ev.get('type')}: a block hash is not an integer")
    return hashes


def _medium(ev: dict[str, Any]) -> str:
    m = ev.get("medium")
    if m is None:
        return DEVICE
    if not isinstance(m, str) or m not in MEDIA:
        raise EventRejected("malformed", f"medium {str(m)[:32]!r} is not one of SGLang's StorageMedium values")
    return m


class WorkerBlocks:
    """The blocks one worker holds, per storage medium."""

    def __init__(self, *, max_blocks: int, max_event_blocks: int | None = None,
                 max_blocks_per_medium: int | None) -> None:
        self.max_blocks = max_blocks
        self.max_blocks_per_medium = max_blocks if max_blocks_per_medium is None else max_blocks_per_medium
        #: blocks of batches refused for passing max_blocks_per_medium, per medium (what they listed there)
        self.refused: dict[str, int] = {}
        #: bumped by `clear`: a batch being applied in steps stops there (its sets were dropped)
        self._epoch = 0
        # None: max_blocks. SGLang merges consecutive stores of a chain (and all removals of a step) into
        # one event (KVCacheEventRecorder.enqueue, sglang/srt/mem_cache/events.py) and removes a node's
        # pages in one, so at its default page size 1 evicting a cached prompt of n tokens is one
        # BlockRemoved of n hashes (storing it one BlockStored with chunked prefill off): a lower
        # per-event limit would untrust a worker for serving a long prompt.
        self.max_event_blocks = max_blocks if max_event_blocks is None else max_event_blocks
        #: device blocks: what a prompt is matched against
        self.device = BlockTable()
        #: blocks on other media (host memory, storage), kept for tiered scoring
        self.other: dict[str, BlockTable] = {}
        #: `tiers` of the last weight function asked, until the next batch changes what is held
        self._tiers: tuple[Callable[[str], float], list[tuple[float, Callable[[int], bool]]]] | None = None
        #: distinct blocks over every medium (len of the union), kept by `apply`
        self._distinct = 0

    def __len__(self) -> int:
        """Distinct blocks held, on any medium (a page in HBM and host counts once): what `max_blocks`
        bounds. `snapshot` counts per medium."""
        return self._distinct

    @property
    def holds(self) -> Callable[[int], bool]:
        """`holds(block)`: on the device. The device table's lookup itself (the request path calls it
        per anchor probed: no method call in between); fetch it again after a batch (a table grows)."""
        return self.device.has

    def tiers(self, weight: Callable[[str], float]) -> list[tuple[float, Callable[[int], bool]]]:
        """The lower tiers a prompt's chain can continue into, best first: (weight, holds) where
        `holds(block)` is "on the device or on a medium weighted at least this" (the chain is
        prefix-closed over the union: SGLang keeps a host page's parent on the device or the host).
        Empty when the worker holds nothing below the device: the caller's fast path. Kept until the
        next batch: the request path builds it once per batch, not once per lookup."""
        cached = self._tiers
        if cached is not None and cached[0] == weight:
            return cached[1]
        out = self._build_tiers(weight)
        self._tiers = (weight, out)
        return out

    def _build_tiers(self, weight: Callable[[str], float]) -> list[tuple[float, Callable[[int], bool]]]:
        media = [(weight(m), s) for m, s in self.other.items() if s]
        if not media:
            return []
        media.sort(key=lambda ms: -ms[0])
        out: list[tuple[float, Callable[[int], bool]]] = []
        sets: list[BlockTable] = [self.device]
        i = 0
        while i < len(media):
            w = media[i][0]
            while i < len(media) and media[i][0] == w:  # equal weights: one level
                sets.append(media[i][1])
                i += 1
            out.append((w, member(tuple(sets))))
        return out

    def clear(self) -> None:
        self._epoch += 1
        self.device = BlockTable()
        self.other = {}
        self._tiers = None
        self._distinct = 0

    def _others(self, target: BlockTable) -> list[BlockTable]:
        """The non-empty sets of the media other than `target`'s."""
        return [s for s in (self.device, *self.other.values()) if s and s is not target]

    def _set(self, medium: str) -> BlockTable:
        if medium == DEVICE:
            return self.device
        s = self.other.get(medium)
        if s is None:
            s = self.other[medium] = BlockTable()
        return s

    def apply(self, events: Any) -> BatchEffect:
        """Apply one batch's events, all or nothing. Raises EventRejected (nothing applied)."""
        steps = self.apply_steps(events)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                eff: BatchEffect = done.value
                return eff

    def apply_steps(self, events: Any, step_blocks: int = STEP_BLOCKS) -> Generator[None, None, BatchEffect]:
        """`apply` in slices of `step_blocks` hashes, yielding between them (module docstring). The batch
        is validated whole before the first slice (EventRejected: nothing applied)."""
        if not isinstance(events, list):
            raise EventRejected("malformed", "events is not a list")
        epoch = self._epoch
        plan = yield from self._validate(events, step_blocks)
        eff = BatchEffect()
        if self._epoch != epoch:  # cleared while it was checked: what it was checked against is gone
            return eff
        for kind, medium, hashes, ev in plan:
            if kind == "AllBlocksCleared":
                self.clear()
                epoch = self._epoch
                eff.cleared = True
                continue
            if kind == "BlockStored":
                # sized for the whole list first (its repeats too: a message bounds them), rehashed
                # in slices when it grows; readers see the old table meanwhile
                for _ in self._set(medium).reserve(len(hashes), 2 * step_blocks):
                    yield
                    if self._epoch != epoch:
                        return eff
            for i in range(0, max(len(hashes), 1), step_blocks):
                if i:
                    yield
                    if self._epoch != epoch:  # cleared meanwhile (a restart, a reset): the batch is moot
                        return eff
                self._tiers = None  # which media are empty may change
                part = hashes[i:i + step_blocks] if len(hashes) > step_blocks else hashes
                if kind == "BlockStored":
                    self._store(self._set(medium), part)
                else:
                    self._remove(medium, part, eff)
                self._tiers = None  # (a table that grew is another array: `tiers` bound the old one)
            if kind == "BlockStored":
                eff.stored += len(hashes)
                eff.block_size = ev.get("block_size")
                tokens = ev.get("token_ids")
                if tokens:
                    eff.bigram = isinstance(tokens[0], list | tuple)
        return eff

    def _store(self, target: BlockTable, hashes: list[int]) -> None:
        new = target.add(hashes)
        # a block already on another medium (a host backup, a load back) is not new
        self._distinct += len(_not_in(new, self._others(target)))

    def _remove(self, medium: str, hashes: list[int], eff: BatchEffect) -> None:
        # a removal creates no table: only stores bring a medium in
        target = self.device if medium == DEVICE else self.other.get(medium)
        held = target.remove(hashes) if target is not None else []
        if held and target is not None:
            # a block leaving one medium stays held while another has it (HBM evicts a backed-up page)
            self._distinct -= len(_not_in(held, self._others(target)))
        eff.removed += len(held)
        eff.unknown_removed += len(hashes) - len(held)

    def _validate(self, events: list[Any], step_blocks: int = STEP_BLOCKS
                  ) -> Generator[None, None, list[tuple[str, str, list[int], dict[str, Any]]]]:
        """Check the whole batch before any of it is applied: stores chain to held (or earlier) blocks
        and the worker stays within max_blocks. Yields after each event of more than `step_blocks`
        hashes (their type check is one C pass, ~10 ms for 200,000 on a quiet host): the checks of a
        batch of four such events held the loop ~40 ms in one piece. Nothing is applied meanwhile."""
        plan: list[tuple[str, str, list[int], dict[str, Any]]] = []
        # this batch's stores so far, as lists: a parent is nearly always the last block of an earlier
        # store (SGLang merges a chain's stores), so the set of them all (0.1-1 s for 800,000 hashes on a
        # loaded host) is built only when a parent is not found that way (`_stored_in`)
        stored_here: list[list[int]] = []
        size = len(self)
        per_medium = {DEVICE: len(self.device), **{m: len(v) for m, v in self.other.items()}}
        cleared = False
        near = False  # the listed hashes alone may pass max_blocks: counted exactly after the walk
        for ev in events:
            if not isinstance(ev, dict):
                raise EventRejected("malformed", "an event is not a map")
            kind = ev.get("type")
            if kind not in EVENT_TYPES:
                raise EventRejected("unknown_event", f"unknown event type {str(kind)[:40]!r}")
            if kind == "AllBlocksCleared":
                plan.append((kind, DEVICE, [], ev))
                stored_here = []
                size = 0
                per_medium = {}
                cleared = True
                continue
            listed = ev.get("block_hashes")
            if kind == "BlockStored" and isinstance(listed, list) and size + len(listed) > self.max_blocks:
                if len(listed) > self.max_blocks:
                    # before the list is walked or the set grows: a hostile batch costs no more than this
                    raise EventRejected("capacity", f"more than {self.max_blocks} blocks on one worker")
                near = True
            hashes = _hashes(ev, self.max_event_blocks)
            medium = _medium(ev)
            if kind == "BlockStored":
                parent = ev.get("parent_block_hash")
                if parent is not None and (not isinstance(parent, int) or isinstance(parent, bool)):
                    raise EventRejected("malformed", "parent_block_hash is not an integer")
                bs = ev.get("block_size")
                if not isinstance(bs, int) or isinstance(bs, bool) or bs <= 0:
                    raise EventRejected("malformed", "block_size is not a positive integer")
                tokens = ev.get("token_ids")
                if not isinstance(tokens, list) or len(tokens) > bs * len(hashes):
                    raise EventRejected("malformed", "token_ids is not a list of at most block_size per block")
                if parent is not None and not (not cleared and self._held_anywhere(parent)) and not _stored_in(
                    parent, stored_here
                ):
                    raise EventRejected("orphan", f"BlockStored under parent {parent} the worker never stored")
                size += len(hashes)
                if hashes:
                    stored_here.append(hashes)
                # listed, not distinct: a re-stored block passes the medium's bound only when it is near
                n = per_medium[medium] = per_medium.get(medium, 0) + len(hashes)
                if n > self.max_blocks_per_medium and self._medium_passes(medium, plan, hashes):
                    self.refused[medium] = self.refused.get(medium, 0) + len(hashes)
                    raise EventRejected("capacity", f"more than {self.max_blocks_per_medium} blocks on medium "
                                                    f"{medium} (max_blocks_per_medium)")
            plan.append((kind, medium, hashes, ev))
            if len(hashes) > step_blocks:
                yield
        if near and (yield from self._passes_bound(plan, step_blocks)):
            raise EventRejected("capacity", f"more than {self.max_blocks} blocks on one worker")
        return plan

    def _passes_bound(self, plan: list[tuple[str, str, list[int], dict[str, Any]]],
                      step_blocks: int = STEP_BLOCKS) -> Generator[None, None, bool]:
        """Whether the distinct blocks pass max_blocks at some store of the batch, counted as they stand
        there (its removals not subtracted): what is held plus what the stores so far add that no medium
        holds. Each store, not the batch's end: a clear at its end would otherwise let the sets grow to
        the whole batch's stores while it is applied (bounded by the message size alone). Only walked
        when the listed counts come near max_blocks: a host backup of held pages lists them again
        without adding one. Yields after each `step_blocks` of a store longer than that (a batch of
        800,000 near the bound held a quiet host's loop ~100 ms here in one piece; a lookup per hash and
        table in Python now)."""
        held = [s for s in (self.device, *self.other.values()) if s]
        size = len(self)
        added: set[int] = set()
        for kind, _medium, hashes, _ev in plan:
            if kind == "AllBlocksCleared":
                held, size, added = [], 0, set()
            elif kind == "BlockStored":
                for i in range(0, len(hashes), step_blocks):  # (the count only grows within a store)
                    new = _not_in(set(hashes[i:i + step_blocks]).difference(added), held)
                    size += len(new)
                    if size > self.max_blocks:
                        return True
                    added.update(new)
                    if len(hashes) > step_blocks:
                        yield
        return False

    def _medium_passes(self, medium: str, plan: list[tuple[str, str, list[int], dict[str, Any]]],
                       hashes: list[int]) -> bool:
        """Whether `medium`'s set would pass max_blocks_per_medium with this batch's stores on it so far
        (and `hashes`), counted distinct; its removals not subtracted (as `_passes_bound`)."""
        table = None if any(k == "AllBlocksCleared" for k, *_ in plan) else (
            self.device if medium == DEVICE else self.other.get(medium))
        held = [table] if table is not None else []
        n = len(table) if table is not None else 0
        added: set[int] = set()
        for kind, m, hs, _ev in plan:
            if kind == "AllBlocksCleared":
                n, added, held = 0, set(), []
            elif kind == "BlockStored" and m == medium:
                new = _not_in(set(hs).difference(added), held)
                n += len(new)
                added.update(new)
        return n + len(_not_in(set(hashes).difference(added), held)) > self.max_blocks_per_medium

    def _held_anywhere(self, block: int) -> bool:
        return self.device.has(block) or any(s.has(block) for s in self.other.values())

    def snapshot(self) -> dict[str, int]:
        out = {DEVICE: len(self.device)}
        out.update({m: len(s) for m, s in self.other.items()})
        return out


def _stored_in(block: int, stored: list[list[int]]) -> bool:
    """Whether an earlier store of the batch listed `block`: the last block of a store first (a chain's
    continuation), then the whole lists."""
    if any(hs[-1] == block for hs in stored):
        return True
    return any(block in hs for hs in stored)  # list scans at C speed, no set built


def _not_in(blocks: Iterable[int], held: list[BlockTable]) -> list[int]:
    """The blocks none of `held` has, in order, one table at a time (each pass only the survivors)."""
    out = list(blocks)
    for h in held:
        if out and h:
            out = h.missing(out)
    return out
