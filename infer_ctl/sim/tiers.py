"""HiCache in the simulator: a host-memory tier (and an optional storage tier) under the radix cache.

Modelled on SGLang 0.5.23's hierarchical radix cache (sglang/srt/mem_cache/unified_radix_cache.py and
unified_cache/unified_tree_core.py): a tree node's KV is on the device (HBM), in host memory, in
storage, or in several; the device part of any path is a prefix of it, and so is the device-or-host part.

- Backup to host (write policy): `write_through` copies a node to host when it is created (hit count
  1), `write_through_selective` on its second hit, `write_back` only when HBM evicts it. A copy needs
  room in the host pool: host-only leaves are evicted LRU to make it (`BlockRemoved` CPU_PINNED); a node
  whose copy does not fit stays device-only.
- HBM eviction (LRU / priority over device leaves, as the plain cache): a node with a host copy only
  leaves the device (`BlockRemoved` GPU) and stays matchable from host; under write_back it is copied
  first (the copy blocks the eviction: its time is charged to the next forward); a node that cannot be
  kept is destroyed with its host-only subtree and counted in `sglang:hicache_dropped_tokens_total`
  (`host_pressure` under write_back, `write_through_unbacked_eviction` under write_through in cache
  mode; SGLang records none under write_through_selective or buffer_only).
- Storage (optional): every host copy is also written to storage (SGLang backs up host pages to L3);
  a host eviction of a node that storage holds keeps it as storage-only (no event: SGLang publishes
  none for L3). Storage evicts its LRU storage-only leaves when full.
- A match reports the device, host and storage parts (`MatchResult.host` / `.storage`); `load_back`
  moves them into HBM before the prefill (`BlockStored` GPU) and prices the copy: host keys at the
  PCIe bandwidth, storage keys at the storage bandwidth plus PCIe. The engine runs the load next to the
  prefill compute (SGLang loads layer by layer ahead of the forward), so a step takes the longer of the
  two. The storage prefetch follows `--hicache-storage-prefetch-policy`: `wait_complete` loads all,
  `timeout` stops after SGLang's default deadline (1 s + 0.25 s per 1,024 tokens,
  `prefetch_timeout_base` / `prefetch_timeout_per_ki_token`, mem_cache/hybrid_cache/
  hybrid_cache_controller.py), `best_effort` loads only what arrives within the time recomputing it
  would take; what is not loaded is `sglang:storage_prefetch_unfulfilled_tokens_total{reason="deadline"}`
  and is computed instead.
- buffer_only host memory (`--hicache-host-memory-mode buffer_only`, which needs a storage tier): host
  memory only stages copies, the tree holds nothing there (unified_radix_cache.py); a backup goes
  straight to storage, an HBM eviction of a stored node keeps it storage-only, a hit loads from storage;
  a span larger than the staging buffer never reaches storage (`hicache_backup_dropped_tokens_total`);
  write_back is write_through there, as SGLang resolves it.
- Runtime attach / detach of the storage tier (`attach_storage` / `detach_storage`, served by
  sim/hicache_api.py as SGLang's `PUT` / `DELETE /hicache/storage-backend`): a detach forgets what only
  storage held (SGLang's tree holds no storage-only nodes; an L3 hit is found by querying the backend,
  which is gone) and stops writing to storage, so no storage hits, prefetches or backups follow; the
  storage series stay, frozen, as SGLang's collector stays registered. An attach starts an empty
  storage view (a file backend's files from before are not found again: a simplification).

Counters and gauges are SGLang's names (`tier_families`). Sizes are in keys (tokens; bigrams on an
EAGLE tree), each one token's KV.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from infer_ctl.core.promtext import MetricFamily
from infer_ctl.sim.kv_events import MEDIUM_CPU, MEDIUM_GPU
from infer_ctl.sim.radix import EvictionPolicy, MatchResult, Node, RadixCache

if TYPE_CHECKING:
    from infer_ctl.sim.kv_events import KvEventRecorder

WritePolicy = Literal["write_through", "write_through_selective", "write_back"]
HostMemoryMode = Literal["cache", "buffer_only"]
PrefetchPolicy = Literal["timeout", "wait_complete", "best_effort"]
WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
PREFETCH_POLICIES = ("timeout", "wait_complete", "best_effort")
#: SGLang's defaults for the `timeout` prefetch policy's deadline (hybrid_cache_controller.py)
PREFETCH_TIMEOUT_BASE_S = 1.0
PREFETCH_TIMEOUT_PER_KI_TOKEN_S = 0.25


@dataclass(frozen=True)
class TierConfig:
    """One worker's tiers, in tokens and bytes per second (the whole server: every rank copies its own
    shard over its own PCIe link, so the server's bandwidth is the per-GPU one times the GPUs)."""

    host_capacity_tokens: int
    kv_bytes_per_token: int
    host_bytes_s: float
    write_policy: WritePolicy = "write_through"
    storage_backend: str | None = None
    storage_capacity_tokens: int | None = None  # None: unbounded
    storage_bytes_s: float = 5e9
    prefetch_policy: PrefetchPolicy = "timeout"
    #: the `timeout` policy's deadline (extra config `prefetch_timeout_base` / `_per_ki_token`)
    prefetch_timeout_base_s: float = PREFETCH_TIMEOUT_BASE_S
    prefetch_timeout_per_ki_token_s: float = PREFETCH_TIMEOUT_PER_KI_TOKEN_S
    #: --hicache-host-memory-mode: `cache` (host DRAM is a tier) or `buffer_only` (host memory only
    #: stages copies between HBM and storage: the tree holds no host values, unified_radix_cache.py)
    host_memory_mode: HostMemoryMode = "cache"

    def __post_init__(self) -> None:
        if self.host_capacity_tokens <= 0:
            raise ValueError(f"host capacity must be positive, got {self.host_capacity_tokens}")
        if self.host_bytes_s <= 0 or self.storage_bytes_s <= 0:
            raise ValueError("tier bandwidths must be positive")
        if self.buffer_only and self.write_policy == "write_back":
            # validate_hicache_host_memory_mode (hicache_hook.py): no host tier to write back to
            object.__setattr__(self, "write_policy", "write_through")

    @property
    def buffer_only(self) -> bool:
        return self.host_memory_mode == "buffer_only"

    def host_seconds(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.host_bytes_s

    def storage_seconds(self, tokens: int) -> float:
        return tokens * self.kv_bytes_per_token / self.storage_bytes_s


@dataclass
class TierCounters:
    """SGLang's HiCache counters, since the worker started."""

    backup_tokens: int = 0  # sglang:hicache_backup_tokens_total{pool="kv"}
    load_back_tokens: int = 0  # sglang:load_back_tokens_total{pool="kv"}
    dropped: dict[str, int] = field(default_factory=lambda: {"host_pressure": 0, "write_through_unbacked_eviction": 0})
    storage_hit_tokens: int = 0  # sglang:storage_prefetch_hit_tokens_total
    storage_unfulfilled: dict[str, int] = field(default_factory=lambda: {"deadline": 0})
    prefetched_tokens: int = 0  # sglang:prefetched_tokens_total
    storage_backup_tokens: int = 0  # sglang:backuped_tokens_total
    backup_dropped_tokens: int = 0  # sglang:hicache_backup_dropped_tokens_total (buffer_only)


class HiRadixCache(RadixCache):
    def __init__(
        self,
        capacity_tokens: int,
        tiers: TierConfig,
        policy: EvictionPolicy = "lru",
        *,
        page_size: int = 1,
        bigram: bool = False,
        events: KvEventRecorder | None = None,
    ) -> None:
        self.tiers = tiers
        #: the tiers the server was launched with (a restart goes back to them: `relaunch`)
        self.launch_tiers = tiers
        #: the `storage_backend` label of the storage series: set once a backend was attached, kept by a
        #: detach (SGLang's storage metrics collector stays registered, its counters stop moving)
        self.storage_label = tiers.storage_backend
        super().__init__(capacity_tokens, policy, page_size=page_size, bigram=bigram, events=events)

    def reset(self) -> None:
        super().reset()
        self.host_size = 0
        self.storage_size = 0
        self.counters = TierCounters()
        #: model seconds of blocking write-back copies not yet charged to a forward
        self.stall_seconds = 0.0

    def relaunch(self) -> None:
        """A process start: the launch tiers again (a runtime attach / detach is gone); the caller resets."""
        self.tiers = self.launch_tiers
        self.storage_label = self.tiers.storage_backend

    # -- runtime storage attach / detach (SGLang's StorageAttachment, unified_cache/storage_attachment.py)
    def detach_storage(self) -> None:
        """Stop the storage tier: storage-only nodes leave the tree (nothing can find them now), the rest
        lose their storage copy, and nothing is written to storage any more."""
        self._forget_storage()
        self.tiers = dataclasses.replace(self.tiers, storage_backend=None)

    def clear_storage(self) -> None:
        """SGLang's `POST /hicache/storage-backend/clear`: the backend's contents are deleted."""
        self._forget_storage()

    def _forget_storage(self) -> None:
        stack = [self.root]
        while stack:
            node = stack.pop()
            for child in list(node.children.values()):
                if child.on_storage and not (child.on_host or child.on_device):
                    self._drop(child)  # its subtree is storage-only too (device-or-host is a prefix)
                else:
                    child.on_storage = False
                    stack.append(child)
        self.storage_size = 0

    def attach_storage(self, backend: str, *, prefetch_policy: PrefetchPolicy | None = None,
                       write_policy: WritePolicy | None = None, timeout_base_s: float | None = None,
                       timeout_per_ki_token_s: float | None = None) -> None:
        """Start (or, with the backend already attached, re-tune) the storage tier; None keeps a setting."""
        t = self.tiers
        self.tiers = dataclasses.replace(
            t, storage_backend=backend, prefetch_policy=prefetch_policy or t.prefetch_policy,
            write_policy=write_policy or t.write_policy,
            prefetch_timeout_base_s=t.prefetch_timeout_base_s if timeout_base_s is None else timeout_base_s,
            prefetch_timeout_per_ki_token_s=t.prefetch_timeout_per_ki_token_s if timeout_per_ki_token_s is None
            else timeout_per_ki_token_s)  # fmt: skip
        self.storage_label = backend

    @property
    def host_capacity(self) -> int:
        return self.tiers.host_capacity_tokens

    def take_stall_seconds(self) -> float:
        s, self.stall_seconds = self.stall_seconds, 0.0
        return s

    # -- match and load-back ----------------------------------------------------------------------
    def match_prefix(self, tokens: Sequence[int], priority: int = 0) -> MatchResult:
        m = super().match_prefix(tokens, priority)
        host = storage = 0
        node = m.node
        while node is not self.root:
            node.hit_count += 1
            if not node.on_device:
                if node.on_host:
                    host += len(node.key)
                else:
                    storage += len(node.key)
            assert node.parent is not None
            node = node.parent
        self._selective_backup(m.node)
        return dataclasses.replace(m, host=host, storage=storage)

    def _path(self, node: Node) -> list[Node]:
        out = []
        while node is not self.root:
            out.append(node)
            assert node.parent is not None
            node = node.parent
        return out[::-1]

    def load_back(self, match: MatchResult, recompute_seconds: float) -> MatchResult:
        if not (match.host or match.storage):
            return match
        below = [n for n in self._path(match.node) if not n.on_device]  # host nodes, then storage-only ones
        from_host = [n for n in below if n.on_host]
        from_storage = below[len(from_host):]
        seconds = self.tiers.host_seconds(sum(len(n.key) for n in from_host))
        arrived = len(from_storage)
        if from_storage:
            self.counters.storage_hit_tokens += match.storage
            deadline = self._prefetch_deadline(match.storage, recompute_seconds)
            spent, arrived = 0.0, 0
            for n in from_storage:
                cost = self.tiers.storage_seconds(len(n.key)) + self.tiers.host_seconds(len(n.key))
                if deadline is not None and spent + cost > deadline:
                    break
                spent, arrived = spent + cost, arrived + 1
            seconds += spent
            got = sum(len(n.key) for n in from_storage[:arrived])
            self.counters.prefetched_tokens += got
            self.counters.storage_unfulfilled["deadline"] += match.storage - got
        missing = sum(len(n.key) for n in from_storage[arrived:])
        target = match.node
        if arrived < len(from_storage):  # the match ends where the prefetch stopped; the rest is computed
            parent = from_storage[arrived].parent
            assert parent is not None
            target = parent
        for n in [*from_host, *from_storage[:arrived]]:
            if not n.on_host and not self.tiers.buffer_only:  # a storage prefetch lands in host memory first
                self._backup_to_host(n, count=False)
            self._to_device(n)
            self.counters.load_back_tokens += len(n.key)
        self.lock(target)  # the loaded path must survive the room it makes
        if self.size > self.capacity:
            self.evict(self.size - self.capacity)
        self.unlock(target)
        return MatchResult(match.length - missing, target, host=match.host, storage=match.storage - missing,
                           load_seconds=seconds)

    def _to_device(self, node: Node) -> None:
        node.on_device = True
        self.size += len(node.key)
        if self.events is not None:
            self.events.record_store(node, MEDIUM_GPU)

    def _prefetch_deadline(self, tokens: int, recompute_seconds: float) -> float | None:
        policy = self.tiers.prefetch_policy
        if policy == "wait_complete":
            return None
        if policy == "best_effort":
            return recompute_seconds
        return self.tiers.prefetch_timeout_base_s + self.tiers.prefetch_timeout_per_ki_token_s * tokens / 1024

    # -- insert and backups -----------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], priority: int = 0, *, evict: bool = True) -> int:
        """The plain cache's insert, with the prefill's KV on the device along the whole path (a prefix
        that was in host memory only was computed again, or loaded back), and write-through backups."""
        units = self.keys(tokens)
        match = self._match(units, priority)
        for n in self._path(match.node):
            if not n.on_device:
                self._to_device(n)
                if not n.on_host and self.tiers.write_policy == "write_through":
                    # a storage-only prefix computed again is a new device node to SGLang (its tree holds
                    # no storage-only nodes): written through to host like one
                    self._backup_to_host(n)
        added = len(units) - match.length
        if added:
            leaf = Node(key=list(units[match.length :]), parent=match.node, priority=priority,
                        last_access=next(self._clock), hit_count=1)  # fmt: skip
            match.node.children[self._child_key(leaf.key, 0)] = leaf
            self.size += added
            if self.events is not None:
                self.events.record_store(leaf)
            if self.tiers.write_policy == "write_through":
                self._backup_to_host(leaf)
        if evict and self.size > self.capacity:
            self.evict(self.size - self.capacity)
        return added

    def _selective_backup(self, node: Node) -> None:
        """write_through_selective: a node is copied to host on its second hit (SGLang's threshold 2)."""
        if self.tiers.write_policy != "write_through_selective":
            return
        for n in self._path(node):
            if n.on_device and not n.on_host and n.hit_count >= 2:
                self._backup_to_host(n)

    def _backup_to_host(self, node: Node, *, count: bool = True) -> bool:
        need = len(node.key)
        if self.tiers.buffer_only:
            return self._backup_through_buffer(node, need)
        if self.host_size + need > self.host_capacity:
            self._evict_host(self.host_size + need - self.host_capacity, keep=node)
        if self.host_size + need > self.host_capacity:
            return False
        node.on_host = True
        self.host_size += need
        if count:
            self.counters.backup_tokens += need
        if self.events is not None:
            self.events.record_store(node, MEDIUM_CPU)
        if self.tiers.storage_backend is not None and not node.on_storage:
            self._backup_to_storage(node)
        return True

    def _backup_through_buffer(self, node: Node, need: int) -> bool:
        """buffer_only: the copy is staged in host memory and written to storage; nothing stays in host.
        A span the staging buffer cannot hold, or storage cannot take, never reaches storage
        (`sglang:hicache_backup_dropped_tokens_total`: admission rejected it, buffer_mode/pipeline.py)."""
        if node.on_storage:
            return True
        if self.tiers.storage_backend is None:
            return False  # detached: nothing to write to
        self.counters.backup_tokens += need  # the D2H staging copy
        if need > self.host_capacity or not self._backup_to_storage(node):
            self.counters.backup_dropped_tokens += need
            return False
        return True

    def _backup_to_storage(self, node: Node) -> bool:
        need = len(node.key)
        cap = self.tiers.storage_capacity_tokens
        if cap is not None and self.storage_size + need > cap:
            self._evict_storage(self.storage_size + need - cap, keep=node)
            if self.storage_size + need > cap:
                return False
        node.on_storage = True
        self.storage_size += need
        self.counters.storage_backup_tokens += need
        return True

    # -- eviction -----------------------------------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """HBM eviction: device leaves (no child on the device), lowest rank first."""
        heap = [(self._rank(n), id(n), n) for n in self._device_leaves()]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_tokens:
            _, _, leaf = heapq.heappop(heap)
            if not leaf.on_device or leaf.lock_ref > 0 or any(c.on_device for c in leaf.children.values()):
                continue
            n = len(leaf.key)
            if not leaf.on_host and self.tiers.write_policy == "write_back" and self._backup_to_host(leaf):
                self.stall_seconds += self.tiers.host_seconds(n)  # the D->H copy blocks the eviction
            parent = leaf.parent
            assert parent is not None
            self.size -= n
            freed += n
            if leaf.on_host or leaf.on_storage:  # kept below HBM (buffer_only: in storage only)
                if not leaf.on_host:
                    # storage-only now: nothing below it may stay in host memory (the device-or-host
                    # part of a path is a prefix; load_back relies on it)
                    for child in list(leaf.children.values()):
                        self._demote_from_host(child)
                leaf.on_device = False
                if self.events is not None:
                    self.events.record_remove(leaf, MEDIUM_GPU, gone=False)
            else:
                reason = self._drop_reason()
                if reason is not None:
                    self.counters.dropped[reason] += n
                self._drop(leaf)
            if parent is not self.root and parent.on_device and parent.lock_ref == 0 and not any(
                c.on_device for c in parent.children.values()
            ):
                heapq.heappush(heap, (self._rank(parent), id(parent), parent))
        self.evicted_total += freed
        return freed

    def _demote_from_host(self, node: Node) -> None:
        """`node` and its subtree leave host memory: kept as storage-only where storage holds them, else
        dropped (with what is below them)."""
        if not node.on_host:
            return  # storage-only already, and so is its subtree
        if not node.on_storage:
            self._drop(node)
            return
        node.on_host = False
        self.host_size -= len(node.key)
        if self.events is not None:
            self.events.record_remove(node, MEDIUM_CPU, gone=False)
        for child in list(node.children.values()):
            self._demote_from_host(child)

    def _drop_reason(self) -> str | None:
        """The `reason` SGLang records a device node destroyed without a backup under
        (unified_radix_cache.py): `host_pressure` from the write-back drop fallback,
        `write_through_unbacked_eviction` only in cache mode under write_through
        (`_tracks_write_through_unbacked_evictions`); write_through_selective and buffer_only record none."""
        if self.tiers.write_policy == "write_back":
            return "host_pressure"
        if self.tiers.write_policy == "write_through" and not self.tiers.buffer_only:
            return "write_through_unbacked_eviction"
        return None

    def _device_leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            kids = list(node.children.values())
            stack.extend(kids)
            if (node is not self.root and node.on_device and node.lock_ref == 0
                    and not any(c.on_device for c in kids)):  # fmt: skip
                out.append(node)
        return out

    def _drop(self, node: Node) -> None:
        """Remove `node` (device or not) and its subtree from the tree, from every tier."""
        for child in list(node.children.values()):
            self._drop(child)
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key, 0)]
        if self.events is not None:
            if node.on_device:
                self.events.record_remove(node, MEDIUM_GPU, gone=not (node.on_host or node.on_storage))
            if node.on_host:
                self.events.record_remove(node, MEDIUM_CPU, gone=not node.on_storage)
            if node.on_storage:
                self.events.record_forget(node)
        if node.on_host:
            self.host_size -= len(node.key)
        if node.on_storage:
            self.storage_size -= len(node.key)

    def _lower_leaves(self, tier: str, keep: Node) -> list[Node]:
        """Leaves of the host (or storage) tier: held there, not on the device (nor in host, for
        storage), no child in that tier or above, not locked."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            kids = list(node.children.values())
            stack.extend(kids)
            if node is self.root or node is keep or node.on_device or node.lock_ref:
                continue
            host_leaf = tier == "host" and node.on_host and not any(c.on_host or c.on_device for c in kids)
            storage_leaf = tier == "storage" and node.on_storage and not node.on_host and not kids
            if host_leaf or storage_leaf:
                out.append(node)
        return out

    def _evict_host(self, num_tokens: int, keep: Node) -> int:
        freed = 0
        for leaf in sorted(self._lower_leaves("host", keep), key=self._rank):
            if freed >= num_tokens:
                break
            freed += len(leaf.key)
            if leaf.on_storage:  # it stays in the tree as storage-only
                leaf.on_host = False
                self.host_size -= len(leaf.key)
                if self.events is not None:
                    self.events.record_remove(leaf, MEDIUM_CPU, gone=False)
            else:
                self._drop(leaf)
        return freed

    def _evict_storage(self, num_tokens: int, keep: Node) -> int:
        freed = 0
        for leaf in sorted(self._lower_leaves("storage", keep), key=self._rank):
            if freed >= num_tokens:
                break
            freed += len(leaf.key)
            self._drop(leaf)
        return freed


#: the reasons SGLang 0.5.23's StorageMetricsCollector creates at 0 when a storage backend attaches
#: (observability/metrics_collector.py), so a scrape shows every series before anything happens; the
#: simulator only ever moves `deadline` (and defers nothing)
UNFULFILLED_REASONS = ("below_threshold", "host_capacity", "device_capacity", "device_covered", "storage_transfer",
                       "deadline", "anchor_lost", "aux_window_trim", "device_overlap", "cache_admission_shortfall",
                       "dropped")  # fmt: skip
DEFERRED_REASONS = ("host_capacity", "device_capacity")

#: SGLang reports the storage backend by its class name (`type(storage_backend).__name__`)
STORAGE_CLASS = {"file": "HiCacheFile", "hf3fs": "HiCacheHF3FS", "nixl": "HiCacheNixl", "mooncake": "MooncakeStore"}


def cached_details(cache: RadixCache, cached: int, host: int, storage: int) -> dict[str, Any] | None:
    """meta_info's cached_tokens_details as SGLang 0.5.23 builds it (output_streamer.py): device and host,
    plus storage and the backend's class when a storage tier is attached; None leaves the plain form (or
    null, when nothing was cached)."""
    if not isinstance(cache, HiRadixCache) or not (cached or host or storage):
        return None  # SGLang: None when nothing was cached (meta_info carries null)
    out: dict[str, Any] = {"device": cached - host - storage, "host": host}
    backend = cache.tiers.storage_backend
    if backend is not None:
        out["storage"] = storage
        out["storage_backend"] = STORAGE_CLASS.get(backend, backend)
    return out


def tier_families(cache: RadixCache, labels: dict[str, str]) -> list[MetricFamily]:
    """SGLang 0.5.23's HiCache series (observability/metrics_collector.py) of a tiered cache; none for a
    plain one."""
    if not isinstance(cache, HiRadixCache):
        return []
    c = cache.counters
    fams = [
        MetricFamily("sglang:hicache_host_used_tokens", "Number of tokens currently used in the host KV cache.")
        .add(cache.host_size, **labels),
        MetricFamily("sglang:hicache_host_total_tokens", "Total capacity of the host KV cache in tokens.")
        .add(cache.host_capacity, **labels),
        MetricFamily("sglang:hicache_backup_tokens_total", "Tokens backed up from GPU to local host DRAM (L2).",
                     "counter").add(c.backup_tokens, **labels, pool="kv"),
        MetricFamily("sglang:load_back_tokens_total", "Tokens loaded back from local host DRAM (L2) to GPU.",
                     "counter").add(c.load_back_tokens, **labels, pool="kv"),
    ]
    dropped = MetricFamily("sglang:hicache_dropped_tokens_total",
                           "Logical device KV tokens destroyed without a host backup.", "counter")
    for reason, n in c.dropped.items():
        dropped.add(n, **labels, reason=reason, pool="kv")
    fams.append(dropped)
    if cache.storage_label is not None:  # attached now or before (a detach leaves the series, frozen)
        store = {**labels, "storage_backend": cache.storage_label}
        unfulfilled = MetricFamily("sglang:storage_prefetch_unfulfilled_tokens_total",
                                   "Storage-hit tokens that did not become a usable prefetch.", "counter")
        for reason in dict.fromkeys((*UNFULFILLED_REASONS, *c.storage_unfulfilled)):
            unfulfilled.add(c.storage_unfulfilled.get(reason, 0), **store, reason=reason)
        deferred = MetricFamily("sglang:storage_prefetch_deferred_tokens_total",
                                "Storage-hit tokens whose prefetch was deferred for reuse, by transient capacity "
                                "reason.", "counter")
        for reason in DEFERRED_REASONS:
            deferred.add(0, **store, reason=reason)
        fams += [
            MetricFamily("sglang:storage_prefetch_hit_tokens_total", "Storage-hit tokens returned by an L3 query.",
                         "counter").add(c.storage_hit_tokens, **store),
            unfulfilled,
            deferred,
            MetricFamily("sglang:prefetched_tokens_total", "Prompt tokens transferred from L3 storage into host.",
                         "counter").add(c.prefetched_tokens, **store),
            MetricFamily("sglang:backuped_tokens_total", "Number of backuped tokens.", "counter")
            .add(c.storage_backup_tokens, **store),
        ]
        # registered with the storage collector whatever the host memory mode (0 outside buffer_only)
        fams.append(MetricFamily("sglang:hicache_backup_dropped_tokens_total", "Buffer-mode backup tokens "
                                 "that never reached L3.", "counter").add(c.backup_dropped_tokens, **store))
    return fams
