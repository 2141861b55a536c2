"""The KV events of one radix cache, as SGLang 0.5.23 records them. Pure: no socket, no thread.

SGLang's recorder (`KVCacheEventRecorder`, sglang/srt/mem_cache/events.py) is called by the radix cache
(sglang/srt/mem_cache/radix_cache.py) when a node is created (`BlockStored`, one block per page, chained
to the parent's last page), when a leaf is evicted (`BlockRemoved`, every page of the leaf) and when the
tree is reset at start-up or by `/flush_cache` (`AllBlocksCleared`). Consecutive events of one kind are
merged into one (stores only when the new one continues the previous one's chain). The scheduler takes
the queue once per step and publishes it as one batch; here the engine does that after each prefill
forward (`flush`), and a reset publishes at once.

The work is split in two so the simulated scheduler does none of it: `KvEventRecorder`, called by the
radix cache, only appends what happened (store, split, remove, clear: O(1), no hashing) to the step's
log; `KvEventBuilder`, run by the publisher's thread on each step's log in order, keeps every node's
page digests (core/kvevents/hashing.py: SGLang's SHA-256 chain), follows the splits and turns the log into SGLang's
events. A node's key list is never changed in place (a split gives both halves new lists), so the log
can hold the very list a store saw. With HiCache tiers (tiers.py) a node is stored and removed per medium
(GPU, CPU_PINNED) as SGLang's unified tree core records it, and keeps its digests until it leaves the
tree.

Events are the plain maps msgspec writes for SGLang's tagged structs (`type` first, then the fields in
their declared order, optional fields left at None omitted): the encoded bytes are the same, which
tests/sim/test_kv_events_sglang.py checks against SGLang's own recorder. This simulator has no LoRA
adapters and no `cache_salt`, so `lora_id` is always null and the "dynamo" format (namespaced hashes,
`lora_name`) publishes exactly what "default" does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from infer_ctl.core.kvevents.hashing import DIGEST_LEN, bigram_pairs, block_hashes, last_digest, page_digests

#: SGLang's StorageMedium (disaggregation/kv_events.py): GPU for HBM; CPU_PINNED for HiCache's host tier
#: (unified_tree_core.py records a host backup, a host eviction and a load back to HBM with these)
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU_PINNED"

Event = dict[str, Any]
#: one entry of a step's log: ("store", node, parent or None at the root, key), ("split", child, head,
#: keys in head), ("remove", node), ("clear",)
Op = tuple[Any, ...]
Sink = Callable[[list[Op]], None]


class TreeNode(Protocol):
    """What the recorder reads of a radix node (infer_ctl.sim.radix.Node)."""

    key: list[int]

    @property
    def parent(self) -> TreeNode | None: ...


def stored(hashes: list[int], parent: int | None, token_ids: list[Any], block_size: int,
           medium: str = MEDIUM_GPU) -> Event:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": token_ids,
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
    }


def removed(hashes: list[int], medium: str = MEDIUM_GPU) -> Event:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def cleared() -> Event:
    return {"type": "AllBlocksCleared"}


class KvEventRecorder:
    """The radix cache's side: a log of the step's tree changes, handed to `sink` at the step's end."""

    def __init__(self, *, sink: Sink | None = None) -> None:
        #: where `flush` hands a step's log (the publisher); None: it is only kept for `take`
        self.sink = sink
        self._ops: list[Op] = []

    def record_store(self, node: TreeNode, medium: str = MEDIUM_GPU) -> None:
        parent = node.parent
        self._ops.append(("store", node, parent if parent is not None and parent.key else None, node.key, medium))

    def record_split(self, child: TreeNode, head: TreeNode) -> None:
        self._ops.append(("split", child, head, len(head.key)))

    def record_remove(self, node: TreeNode, medium: str = MEDIUM_GPU, *, gone: bool = True) -> None:
        """`gone`: the node leaves the tree (its digests are dropped); False: it leaves one tier only and
        stays in another (HiCache), so a later store (a load back, a backup) reuses its digests."""
        self._ops.append(("remove", node, medium, gone))

    def record_forget(self, node: TreeNode) -> None:
        """The node leaves the tree from a tier SGLang publishes nothing for (HiCache storage)."""
        self._ops.append(("forget", node))

    def record_all_cleared(self) -> None:
        self._ops.append(("clear",))

    def take(self) -> list[Op]:
        ops, self._ops = self._ops, []
        return ops

    def flush(self) -> None:
        """End of a scheduler step: hand its log to the sink as one batch."""
        if self._ops and self.sink is not None:
            self.sink(self.take())


class KvEventBuilder:
    """The publisher's side: every live node's page digests, and SGLang's events for a step's log."""

    def __init__(self, page_size: int, *, bigram: bool = False) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.bigram = bigram
        self._digests: dict[Any, bytes] = {}  # node (by identity) -> 32 bytes per page

    def build(self, ops: Sequence[Op]) -> list[Event]:
        events: list[Event] = []
        for op in ops:
            kind = op[0]
            if kind == "store":
                self._store(events, op[1], op[2], op[3], op[4] if len(op) > 4 else MEDIUM_GPU)
            elif kind == "split":
                _, child, head, n = op
                digests = self._digests.pop(child, b"")
                cut = n // self.page_size * DIGEST_LEN
                self._digests[head], self._digests[child] = digests[:cut], digests[cut:]
            elif kind == "remove":
                medium, gone = (op[2], op[3]) if len(op) > 2 else (MEDIUM_GPU, True)
                digests = self._digests.pop(op[1], b"") if gone else self._digests.get(op[1], b"")
                hashes = block_hashes(digests)
                if hashes:
                    _enqueue(events, removed(hashes, medium))
            elif kind == "forget":
                self._digests.pop(op[1], None)
            else:
                self._digests.clear()
                _enqueue(events, cleared())
        return events

    def _store(self, events: list[Event], node: Any, parent: Any, key: list[int], medium: str = MEDIUM_GPU) -> None:
        prior = last_digest(self._digests.get(parent)) if parent is not None else None
        digests = self._digests.get(node)  # a node stored in another tier already (HiCache) keeps its hashes
        if digests is None:
            digests = page_digests(key, self.page_size, prior, bigram=self.bigram)
            self._digests[node] = digests
        hashes = block_hashes(digests)
        parent_hash = block_hashes(prior)[0] if prior is not None else None  # the root contributes no link
        tokens: list[Any] = bigram_pairs(key) if self.bigram else list(key)
        ps = self.page_size
        if len(tokens) % ps:  # SGLang's pages are page-aligned; a short last page only under tests
            for i, h in enumerate(hashes):
                page = tokens[i * ps : (i + 1) * ps]
                _enqueue(events, stored([h], parent_hash, page, len(page), medium))
                parent_hash = h
            return
        _enqueue(events, stored(hashes, parent_hash, tokens, ps, medium))


def _enqueue(events: list[Event], event: Event) -> None:
    """SGLang's coalescing: a remove joins a remove; a store joins a store it continues."""
    if events:
        tail = events[-1]
        kind = event["type"]
        if tail.get("medium") != event.get("medium"):  # one event per tier
            events.append(event)
            return
        if kind == tail["type"] == "BlockRemoved":
            tail["block_hashes"].extend(event["block_hashes"])
            return
        if (
            kind == tail["type"] == "BlockStored"
            and tail["block_size"] == event["block_size"]
            and tail["block_hashes"]
            and event["parent_block_hash"] == tail["block_hashes"][-1]
        ):
            tail["block_hashes"].extend(event["block_hashes"])
            tail["token_ids"].extend(event["token_ids"])
            return
    events.append(event)
