"""The simulator's KV events against SGLang 0.5.23's own code: its msgspec classes decode them, its
encoder writes the same bytes, its `ZmqEventPublisher` sends the same frames, and its event recorder
(`KVCacheEventRecorder`, with SGLang's own page hash function) records exactly the same events for the
same tree operations.

Real part: the `sglang` extra (`sglang.srt.disaggregation.kv_events`, `sglang.srt.mem_cache.events`,
`sglang.srt.mem_cache.utils`; the hash is SGLang's C++ kernel, built on first use through torch's
extension loader). Skipped, with the reason, where SGLang (or its hash kernel) is not available.
"""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from infer_ctl.core.kvevents.hashing import block_hashes, pack_bigrams, page_digests
from infer_ctl.launch.argcheck import sglang_available
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from infer_ctl.sim.kv_config import describe, offset_endpoint, parse_kv_events_config
from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder
from infer_ctl.sim.kv_publisher import ZmqKvPublisher
from infer_ctl.sim.radix import Node, RadixCache
from tests.sim.kv_client import END_SEQ, Subscriber, free_port, kv_config, replay
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.sglang,
    pytest.mark.skipif(not sglang_available(), reason="sglang not importable: pip install 'inferctl[sglang]'"),
]


@pytest.fixture(scope="module")
def sglang_hash() -> Any:
    """SGLang's page hash (`get_hash_str`, its C++ kernel) and `hash_str_to_int64`."""
    try:
        from sglang.srt.mem_cache import utils

        # torch's extension loader imports setuptools; once another test has imported the stdlib's
        # distutils, setuptools' own-distutils shim asserts unless told to use the stdlib's
        with pytest.MonkeyPatch.context() as env:
            env.setenv("SETUPTOOLS_USE_DISTUTILS", "stdlib")
            utils.get_hash_str([1, 2], None, page_size=1)
    except Exception as exc:  # the kernel needs torch and a C++ compiler
        cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
        pytest.skip(f"SGLang's page hash kernel is not available here: {type(exc).__name__}: {exc}{cause}")
    return utils


class _SglKey:
    """SGLang's RadixKey as its hash function and recorder read it (token_ids, bigram view, namespace)."""

    def __init__(self, raw: list[int], bigram: bool) -> None:
        self.token_ids = array("q", raw)
        self.is_bigram = bigram
        self.extra_key = None
        self.cache_salt = None

    def __len__(self) -> int:
        n = len(self.token_ids)
        return max(0, n - 1) if self.is_bigram else n

    def raw_token_ids(self) -> array[int]:
        return self.token_ids


class _SglNode:
    def __init__(self, key: _SglKey, parent: _SglNode | None) -> None:
        self.key, self.parent = key, parent
        self.hash_value: list[str] | None = None
        self.event_hash_value: list[str] | None = None


class TwinRecorder(KvEventRecorder):
    """Logs as the simulator does and, for every call, has SGLang's recorder record the same node
    (rebuilt from the simulator's tree, its hashes computed by SGLang's own functions)."""

    def __init__(self, page_size: int, bigram: bool, dynamo: bool, utils: Any) -> None:
        from sglang.srt.mem_cache.events import KVCacheEventRecorder

        super().__init__()
        self.page_size, self.bigram = page_size, bigram
        self.builder = KvEventBuilder(page_size, bigram=bigram)
        self.utils = utils
        self.sgl = KVCacheEventRecorder(enabled=True, page_size=page_size, dynamo_format=dynamo)

    def _raw(self, node: Node) -> list[int]:
        if not self.bigram:
            return list(node.key)
        raw = [node.key[0] & 0xFFFFFFFF] if node.key else []
        return raw + [u >> 32 for u in node.key]

    def _shadow(self, node: Node) -> _SglNode:
        path = []
        n: Node | None = node
        while n is not None:
            path.append(n)
            n = n.parent
        parent: _SglNode | None = None
        for n in reversed(path):
            shadow = _SglNode(_SglKey(self._raw(n), self.bigram), parent)
            if parent is None:
                shadow.hash_value = []  # the root, as RadixCache.reset sets it
            else:
                shadow.hash_value = self.utils.compute_node_hash_values(shadow, self.page_size)
            parent = shadow
        assert parent is not None
        return parent

    def record_store(self, node: Any) -> None:
        super().record_store(node)
        self.sgl.record_store(self._shadow(node))

    def record_remove(self, node: Any) -> None:
        super().record_remove(node)
        self.sgl.record_remove(self._shadow(node))

    def record_all_cleared(self) -> None:
        super().record_all_cleared()
        self.sgl.record_all_cleared()


@pytest.mark.parametrize(("page_size", "bigram", "dynamo"), [(1, False, False), (1, True, False), (4, False, False),
                                                             (2, True, False), (4, True, True)])  # fmt: skip
def test_the_same_tree_operations_record_the_same_events_as_sglangs_recorder(
    sglang_hash: Any, page_size: int, bigram: bool, dynamo: bool
) -> None:
    """Random prompts sharing prefixes (splits), under cache pressure (evictions, coalesced removes),
    with resets: after every step the simulator's events encode to the very bytes SGLang's do."""
    rng = random.Random(page_size * 10 + bigram)
    twin = TwinRecorder(page_size, bigram, dynamo, sglang_hash)
    cache = RadixCache(300, page_size=page_size, bigram=bigram, events=twin)
    stems = [[rng.randrange(1, 50_000) for _ in range(rng.randrange(5, 60))] for _ in range(6)]
    for step in range(60):
        for _ in range(rng.randrange(1, 4)):
            prompt = rng.choice(stems)[: rng.randrange(1, 60)] + [rng.randrange(1, 50_000) for _ in range(rng.randrange(0, 30))]
            cache.insert(prompt)
        if step % 25 == 24:
            cache.reset()
        ours, theirs = twin.builder.build(twin.take()), twin.sgl.take()
        assert msgspec.msgpack.encode(ours) == msgspec.msgpack.encode(theirs), f"step {step}"
    assert cache.evicted_total > 0


def test_block_hashes_are_sglangs_for_the_same_tokens(sglang_hash: Any) -> None:
    u = sglang_hash
    rng = random.Random(3)
    for page_size in (1, 2, 16, 64):
        tokens = [rng.randrange(0, 150_000) for _ in range(200)]
        theirs = [u.hash_str_to_int64(h) for h in u.get_hash_str(tokens, None, page_size=page_size)]
        assert block_hashes(page_digests(tokens, page_size, None)) == theirs
    wide = [5, 2**40, 7]  # an id past uint32: SGLang's wide page encoding
    theirs = [u.hash_str_to_int64(h) for h in u.get_hash_str(wide, None, page_size=2)]
    assert block_hashes(page_digests(wide, 2, None)) == theirs
    for raw in (tokens[:50], [5, 2**40, 7, 8, 9]):  # bigram pages, also with a wide id
        theirs = [u.hash_str_to_int64(h) for h in u.get_hash_str(_SglKey(raw, bigram=True), None, page_size=2)]
        assert block_hashes(page_digests(pack_bigrams(raw), 2, None, bigram=True)) == theirs


# -- a live worker's stream, decoded by SGLang's classes -----------------------------------------------
@pytest.fixture(scope="module")
def worker() -> Iterator[ThreadedSimCluster]:
    spec = WorkerSpec("mixed", time_scale=0.01, speculative=False, page_size=2, cache_capacity_tokens=64,
                      kv_events_config=kv_config())  # fmt: skip
    c = start_cluster_in_thread([spec])
    yield c
    c.stop()


def test_sglangs_msgspec_classes_decode_a_live_stream(worker: ThreadedSimCluster) -> None:
    from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

    cfg = json.loads(worker.workers[0].spec.kv_events_config or "")
    sub = Subscriber(cfg["endpoint"])
    try:
        sub.sync(worker.urls[0])
        url = worker.urls[0] + "/generate"
        a, b = list(range(10, 50)), list(range(60, 100))
        for prompt in (a, b):  # 40 + 40 > 64 tokens: b evicts a
            r = httpx.post(url, json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}}, timeout=20)
            assert r.status_code == 200
        httpx.post(worker.urls[0] + "/flush_cache").raise_for_status()
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        frames = [sub.frames() for _ in range(3)]
        batches = [decoder.decode(f[2]) for f in frames]
    finally:
        sub.close()
    assert all(isinstance(x, KVEventBatch) and x.attn_dp_rank == 0 and x.ts > 0 for x in batches)
    (first,), (stored_b, removed_a), (cleared,) = (x.events for x in batches)
    assert isinstance(first, BlockStored) and first.token_ids == a and first.block_size == 2
    assert first.parent_block_hash is None and first.medium == "GPU" and first.lora_id is None
    assert len(first.block_hashes) == 20
    assert isinstance(stored_b, BlockStored) and stored_b.token_ids == b
    assert isinstance(removed_a, BlockRemoved) and removed_a.block_hashes == first.block_hashes
    assert isinstance(cleared, AllBlocksCleared)
    # SGLang's encoder writes back the bytes the simulator sent, live and replayed
    seq = int.from_bytes(frames[0][1], "big")
    replayed = replay(cfg["replay_endpoint"], seq)
    assert [r[3] for r in replayed[:3]] == [f[2] for f in frames]
    assert [msgspec.msgpack.encode(x) for x in batches] == [f[2] for f in frames]


def _two_batches_through(name: str) -> tuple[list[Any], list[list[Any]]]:
    """Publish one BlockStored batch twice through SGLang's publisher or the simulator's; the frames
    a subscriber got (payload decoded, its timestamp left out) and the replay answer from the second.
    PUB drops what it sends before the subscription lands, so the batch is first published until one
    arrives; seqs are counted from the first of the two (how many went before is timing)."""
    from sglang.srt.disaggregation.kv_events import (
        BlockStored,
        KVEventBatch,
        StorageMedium,
        ZmqEventPublisher,
    )

    events = [BlockStored(block_hashes=[11, -12], parent_block_hash=None, token_ids=[1, 2], block_size=1,
                          lora_id=None, medium=StorageMedium.GPU)]  # fmt: skip
    endpoint, replay_endpoint = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    sub = Subscriber(endpoint)
    sglang_pub, sim_pub = None, None
    if name == "sglang":
        sglang_pub = ZmqEventPublisher(attn_dp_rank=0, endpoint=endpoint, replay_endpoint=replay_endpoint,
                                       topic="t", bind=True)  # fmt: skip
    else:
        cfg = parse_kv_events_config(json.dumps({"publisher": "zmq", "endpoint": endpoint, "bind": True,
                                                 "replay_endpoint": replay_endpoint, "topic": "t"}))  # fmt: skip
        assert cfg is not None
        sim_pub = ZmqKvPublisher(cfg)

    def publish() -> None:
        if sglang_pub is not None:
            sglang_pub.publish(KVEventBatch(ts=1.0, events=list(events)))
        elif sim_pub is not None:
            sim_pub.publish(msgspec.to_builtins(events))

    def seq(frame: bytes) -> int:
        return int.from_bytes(frame, "big", signed=True)

    try:
        assert wait_for(lambda: publish() or sub.sub.poll(50), timeout=10), "the subscription never landed"
        sub.drain()  # the probe (and one more if it was slow to arrive)
        for _ in range(2):
            publish()
        got = [sub.frames(), sub.frames()]
        base = seq(got[0][1])
        replayed = replay(replay_endpoint, base + 1)
        return ([[f[0], seq(f[1]) - base, msgspec.msgpack.decode(f[2])[1:]] for f in got],
                [[r[0], r[1], seq(r[2]) if r[2] == END_SEQ else seq(r[2]) - base] for r in replayed])
    finally:
        sub.close()
        if sglang_pub is not None:
            sglang_pub.shutdown()
        if sim_pub is not None:
            sim_pub.close()


def test_sglangs_publisher_sends_the_same_frames_and_replays_alike() -> None:
    assert _two_batches_through("sim") == _two_batches_through("sglang")


def test_config_offset_and_descriptor_agree_with_sglang() -> None:
    from sglang.srt.disaggregation.kv_events import KVEventsConfig, ZmqEventPublisher, parse_advertisable_tcp

    text = '{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5600","topic":"kv","hwm":5}'
    ours, theirs = parse_kv_events_config(text), KVEventsConfig.from_cli(text)
    assert ours is not None
    for field in ("publisher", "endpoint", "bind", "replay_endpoint", "buffer_steps", "hwm", "max_queue_size",
                  "topic", "format"):  # fmt: skip
        assert getattr(ours, field) == getattr(theirs, field), field
    for endpoint in ("tcp://*:5557", "tcp://10.0.0.1:6000", "inproc://kv"):
        for rank in (0, 1, 5):
            assert offset_endpoint(endpoint, rank) == ZmqEventPublisher.offset_endpoint_port(endpoint, rank)
    desc = describe(ours, block_size=16)
    assert desc is not None
    assert (desc["endpoint_host"], desc["endpoint_port_base"]) == parse_advertisable_tcp(ours.endpoint)
    assert desc["replay_endpoint_port_base"] == (parse_advertisable_tcp(ours.replay_endpoint) or ("", 0))[1]


def test_a_chunked_prefill_publishes_each_page_once_chained_across_its_chunks() -> None:
    """Batch-time matching: a chunked prompt's chunks enter the tree as they
    are computed, one BlockStored per chunk (its whole pages only: 15-token chunks on 2-token pages),
    each chained to the page the previous chunk ended with, decoded by SGLang's msgspec classes."""
    from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch

    spec = WorkerSpec("mixed", time_scale=0.01, speculative=False, page_size=2, chunked_prefill_size=15,
                      kv_events_config=kv_config())  # fmt: skip
    c = start_cluster_in_thread([spec])
    cfg = json.loads(spec.kv_events_config or "")
    sub = Subscriber(cfg["endpoint"])
    try:
        sub.sync(c.urls[0])
        prompt = list(range(100, 140))  # 40 tokens: forwards of 15, 15, 10
        r = httpx.post(c.urls[0] + "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}},
                       timeout=20)  # fmt: skip
        assert r.status_code == 200
        decoder = msgspec.msgpack.Decoder(KVEventBatch)
        batches = [decoder.decode(sub.frames()[2]) for _ in range(3)]
    finally:
        sub.close()
        c.stop()
    stores = [e for x in batches for e in x.events]
    assert all(isinstance(e, BlockStored) for e in stores) and len(stores) == 3
    assert [e.token_ids for e in stores] == [prompt[:14], prompt[14:30], prompt[30:]]
    assert [len(e.block_hashes) for e in stores] == [7, 8, 5]
    assert stores[0].parent_block_hash is None
    assert [e.parent_block_hash for e in stores[1:]] == [stores[0].block_hashes[-1], stores[1].block_hashes[-1]]
    hashes = [h for e in stores for h in e.block_hashes]
    assert len(set(hashes)) == len(hashes) == 20
