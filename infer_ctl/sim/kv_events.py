"""The KV events of one radix cache, as SGLang 0.5.23 records them. Pure: no socket, no thread.

SGLang's recorder (`KVCacheEventRecorder`, sglang/srt/mem_cache/events.py) is called by the radix cache
(sglang/srt/mem_cache/radix_cache.py) when a node is created (`BlockStored`, one block per page, chained
to the parent's last page), when a leaf is evicted (`BlockRemoved`, every page of the leaf) and when the
tree is reset at start-up or by `/flush_cache` (`AllBlocksCleared`). Consecutive events of one kind are
merged into one (stores only when the new one continues the previous one's chain). The scheduler takes
the queue once per step and publishes it as one batch; here the engine does that after each prefill
forward (`flush`), and a reset publishes at once.

Events are the plain maps msgspec writes for SGLang's tagged structs (`type` first, then the fields in
their declared order, optional fields left at None omitted): the encoded bytes are the same, which
tests/sim/test_kv_events_sglang.py checks by decoding with SGLang's own classes. This simulator has no
LoRA adapters and no `cache_salt`, so `lora_id` is always null and the "dynamo" format (namespaced
hashes, `lora_name`) publishes exactly what "default" does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from infer_ctl.sim.kv_hash import bigram_pairs, block_hashes, last_digest, page_digests

#: SGLang's StorageMedium.GPU: every block of this simulator lives in (simulated) device memory
MEDIUM_GPU = "GPU"

Event = dict[str, Any]
Sink = Callable[[list[Event]], None]


class HashedNode(Protocol):
    """What the recorder reads of a radix node (infer_ctl.sim.radix.Node)."""

    key: list[int]
    digests: bytes | None

    @property
    def parent(self) -> HashedNode | None: ...


def stored(hashes: list[int], parent: int | None, token_ids: list[Any], block_size: int) -> Event:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": token_ids,
        "block_size": block_size,
        "lora_id": None,
        "medium": MEDIUM_GPU,
    }


def removed(hashes: list[int]) -> Event:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": MEDIUM_GPU}


def cleared() -> Event:
    return {"type": "AllBlocksCleared"}


class KvEventRecorder:
    def __init__(self, page_size: int, *, bigram: bool = False, sink: Sink | None = None) -> None:
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.page_size = page_size
        self.bigram = bigram
        #: where `flush` hands a step's events (the publisher); None: they are only kept for `take`
        self.sink = sink
        self._queue: list[Event] = []

    # -- what the radix cache calls -----------------------------------------------------------------
    def node_digests(self, node: HashedNode) -> bytes:
        """The node's page digests, computed once (chained from its parent's) and kept on the node."""
        if node.digests is None:
            parent = node.parent
            prior = last_digest(self.node_digests(parent)) if parent is not None and parent.key else None
            node.digests = page_digests(node.key, self.page_size, prior, bigram=self.bigram)
        return node.digests

    def record_store(self, node: HashedNode) -> None:
        hashes = block_hashes(self.node_digests(node))
        parent = node.parent
        parent_hash = None
        if parent is not None and parent.key:  # the root contributes no link
            parent_hash = block_hashes(last_digest(self.node_digests(parent)) or b"")[0]
        tokens: list[Any] = bigram_pairs(node.key) if self.bigram else list(node.key)
        ps = self.page_size
        if len(tokens) % ps:  # SGLang's pages are page-aligned; a short last page only under tests
            for i, h in enumerate(hashes):
                page = tokens[i * ps : (i + 1) * ps]
                self._enqueue(stored([h], parent_hash, page, len(page)))
                parent_hash = h
            return
        self._enqueue(stored(hashes, parent_hash, tokens, ps))

    def record_remove(self, node: HashedNode) -> None:
        hashes = block_hashes(self.node_digests(node))
        if hashes:
            self._enqueue(removed(hashes))

    def record_all_cleared(self) -> None:
        self._enqueue(cleared())

    # -- the step boundary --------------------------------------------------------------------------
    def take(self) -> list[Event]:
        events, self._queue = self._queue, []
        return events

    def flush(self) -> None:
        """End of a scheduler step: hand what it recorded to the sink as one batch."""
        if self._queue and self.sink is not None:
            self.sink(self.take())

    def _enqueue(self, event: Event) -> None:
        """SGLang's coalescing: a remove joins a remove; a store joins a store it continues."""
        if self._queue:
            tail = self._queue[-1]
            kind = event["type"]
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
        self._queue.append(event)
