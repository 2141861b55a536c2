"""KV events of the simulator, without sockets: the page hash chain, what the radix cache records at each
mutation (store, split, evict, reset), SGLang's coalescing, the --kv-events-config schema, the per-worker
port offset and the /server_info descriptor. The socket side is in test_kv_events_live.py; the
comparison with SGLang's own classes and hash function in test_kv_events_sglang.py."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from typing import Any

import pytest

from infer_ctl.core.kvevents.hashing import block_hashes, pack_bigrams, page_digests
from infer_ctl.sim.config import WorkerSpec
from infer_ctl.sim.kv_config import describe, offset_endpoint, parse_kv_events_config
from infer_ctl.sim.kv_events import KvEventBuilder, KvEventRecorder
from infer_ctl.sim.kv_ports import assign_kv_event_ports
from infer_ctl.sim.radix import RadixCache


def _h64(digest: bytes) -> int:
    return struct.unpack(">q", digest[:8])[0]


def _chain(pages: list[bytes]) -> list[int]:
    """The SHA-256 chain written out by hand from the format's description (core.kvevents.hashing docstring)."""
    out, prior = [], b""
    for data in pages:
        prior = hashlib.sha256(prior + data).digest()
        out.append(_h64(prior))
    return out


def _u32(*ids: int) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def test_page_hashes_are_a_sha256_chain_over_little_endian_uint32_ids() -> None:
    tokens = [1, 2, 3, 4, 5]
    assert block_hashes(page_digests(tokens, 2, None)) == _chain([_u32(1, 2), _u32(3, 4), _u32(5)])
    assert block_hashes(page_digests(tokens, 1, None)) == _chain([_u32(t) for t in tokens])
    # an id past 32 bits makes its page wide: the byte 0xff, then uint64 ids
    wide = [7, 2**33]
    assert block_hashes(page_digests(wide, 2, None)) == _chain([b"\xff" + struct.pack("<2Q", *wide)])
    # a chain continues from the parent's last digest
    head = page_digests([1, 2], 2, None)
    assert page_digests([3, 4], 2, head[-32:]) == page_digests([1, 2, 3, 4], 2, None)[32:]


def test_bigram_pages_hash_each_pair_in_a_row() -> None:
    units = pack_bigrams([10, 11, 12, 13])  # (10,11) (11,12) (12,13)
    assert len(units) == 3
    assert block_hashes(page_digests(units, 2, None, bigram=True)) == _chain(
        [_u32(10, 11, 11, 12), _u32(12, 13)]
    )


def _recording(capacity: int = 1000, page_size: int = 1, bigram: bool = False) -> tuple[RadixCache, list[Any]]:
    """A cache whose step logs are built into events at once (the publisher thread's job)."""
    batches: list[Any] = []
    builder = KvEventBuilder(page_size, bigram=bigram)

    def sink(ops: list[Any]) -> None:
        events = builder.build(ops)
        if events:
            batches.append(events)

    cache = RadixCache(capacity, page_size=page_size, bigram=bigram, events=KvEventRecorder(sink=sink))
    assert batches == [[{"type": "AllBlocksCleared"}]]  # the reset of a new tree
    batches.clear()
    return cache, batches


def _stored(hashes: list[int], parent: int | None, tokens: list[Any], block_size: int) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": "GPU"}  # fmt: skip


def test_insert_stores_one_block_per_page_chained_to_the_parent() -> None:
    cache, batches = _recording(page_size=2)
    assert cache.insert([1, 2, 3, 4, 5]) == 4  # whole pages only: the 5th token is not cached
    cache.end_step()
    first = _chain([_u32(1, 2), _u32(3, 4)])
    assert batches == [[_stored(first, None, [1, 2, 3, 4], 2)]]
    assert cache.match_prefix([1, 2, 3, 9]).length == 2  # matches are whole pages too
    cache.insert([1, 2, 7, 8])  # splits the first node after page 1; the new leaf hangs below it
    cache.end_step()
    leaf = block_hashes(page_digests([7, 8], 2, hashlib.sha256(_u32(1, 2)).digest()))
    assert batches[1] == [_stored(leaf, first[0], [7, 8], 2)]


def test_stores_of_one_step_coalesce_when_they_continue_each_other() -> None:
    cache, batches = _recording()
    cache.insert([1, 2])
    cache.insert([1, 2, 3])  # continues the previous store's chain: one event
    cache.insert([9])  # a new root chain: a new event
    cache.end_step()
    (events,) = batches
    assert [e["token_ids"] for e in events] == [[1, 2, 3], [9]]
    assert events[0]["block_hashes"] == _chain([_u32(1), _u32(2), _u32(3)])


def test_eviction_removes_exactly_the_hashes_that_were_stored() -> None:
    cache, batches = _recording(capacity=6)
    cache.insert([1, 2, 3, 4])
    cache.end_step()
    cache.insert([5, 6, 7, 8])  # 8 > 6: the least recently used leaf [1, 2, 3, 4] goes
    cache.end_step()
    stored_first = batches[0][0]["block_hashes"]
    assert batches[1][0]["type"] == "BlockStored"
    assert batches[1][1] == {"type": "BlockRemoved", "block_hashes": stored_first, "medium": "GPU"}
    assert cache.match_prefix([1, 2, 3, 4]).length == 0


def test_a_split_node_is_removed_with_its_own_pages_only() -> None:
    cache, batches = _recording(capacity=100)
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 9])  # split: [1, 2] -> {[3, 4], [9]}
    cache.end_step()
    all_four = batches[0][0]["block_hashes"]
    cache.evict(100)
    cache.end_step()
    removed = batches[1]
    assert len(removed) == 1 and removed[0]["type"] == "BlockRemoved"  # consecutive removes coalesce
    assert sorted(removed[0]["block_hashes"]) == sorted([*all_four, batches[0][1]["block_hashes"][0]])


def test_reset_publishes_all_blocks_cleared_at_once() -> None:
    cache, batches = _recording()
    cache.insert([1, 2, 3])
    cache.reset()  # pending events first, then the clear, in one batch
    assert [e["type"] for e in batches[0]] == ["BlockStored", "AllBlocksCleared"]


def test_an_eagle_tree_is_keyed_and_published_by_bigrams() -> None:
    cache, batches = _recording(page_size=2, bigram=True)
    assert cache.insert([10, 11, 12, 13, 14]) == 4  # 4 bigrams, 2 pages
    cache.end_step()
    (event,) = batches[0]
    assert event["token_ids"] == [(10, 11), (11, 12), (12, 13), (13, 14)]
    assert event["block_size"] == 2
    assert event["block_hashes"] == _chain([_u32(10, 11, 11, 12), _u32(12, 13, 13, 14)])
    assert cache.match_prefix([10, 11, 12, 13]).length == 2  # 3 bigrams -> 1 whole page


def test_a_step_that_only_splits_publishes_nothing() -> None:
    cache, batches = _recording()
    cache.insert([1, 2, 3, 4])
    cache.end_step()
    cache.match_prefix([1, 2, 9])  # splits [1, 2, 3, 4]: the blocks stay the same
    cache.end_step()
    assert len(batches) == 1
    cache.insert([1, 2, 7])  # the split head's digests continue the chain
    cache.end_step()
    assert batches[1][0]["parent_block_hash"] == batches[0][0]["block_hashes"][1]


def test_the_recorder_only_logs_on_the_schedulers_path() -> None:
    rec = KvEventRecorder()
    cache = RadixCache(100, events=rec)
    rec.take()
    cache.insert([1, 2, 3])
    cache.insert([1, 9])
    (store, split, store2) = rec.take()
    assert store[0] == "store" and store[2] is None and store[3] == [1, 2, 3]  # a child of the root
    assert split[0] == "split" and split[3] == 1
    assert store2[0] == "store" and store2[2] is split[2] and store2[3] == [9]


# -- --kv-events-config --------------------------------------------------------------------------------
def test_config_schema_is_sglangs_and_refuses_what_sglang_would_not_start_with() -> None:
    cfg = parse_kv_events_config('{"publisher": "zmq"}')
    assert cfg is not None and cfg.endpoint == "tcp://*:5557" and cfg.buffer_steps == 10_000
    assert cfg.should_bind()
    assert parse_kv_events_config(None) is None
    bad = {
        '{"publisher": "kafka"}': "Unknown event publisher",
        '{"publisher": "zmq", "endpont": "tcp://*:1"}': "unknown key(s) endpont",
        '{"hwm": "many"}': "hwm has the wrong type",
        '{"bind": 1}': "bind has the wrong type",
        '{"format": "vllm"}': "format must be one of",
        "[1]": "must be a JSON object",
        "{": "not JSON",
    }
    for text, why in bad.items():
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_kv_events_config(text)
    with pytest.raises(ValueError, match="Unknown event publisher"):
        WorkerSpec("mixed", kv_events_config='{"publisher": "kafka"}')


def test_bind_or_connect_follows_sglangs_rule() -> None:
    def binds(**kw: Any) -> bool:
        cfg = parse_kv_events_config(json.dumps({"publisher": "zmq", **kw}))
        assert cfg is not None
        return cfg.should_bind()

    assert binds(endpoint="tcp://0.0.0.0:5557") and binds(endpoint="tcp://[::]:5557")
    assert binds(endpoint="ipc:///tmp/kv") and binds(endpoint="inproc://kv")
    assert not binds(endpoint="tcp://10.0.0.5:5557")  # a concrete host: connect to a collector there
    assert binds(endpoint="tcp://127.0.0.1:5557", bind=True)


def test_ports_move_per_rank_as_sglang_moves_them() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("inproc://cache", 2) == "inproc://cache_dp2"
    with pytest.raises(ValueError):
        offset_endpoint("ipc:///tmp/kv", 1)


def test_each_worker_of_a_process_gets_its_own_ports() -> None:
    specs = [WorkerSpec("prefill"), WorkerSpec("prefill"), WorkerSpec("decode"), WorkerSpec("decode")]
    text = '{"publisher":"zmq","replay_endpoint":"tcp://*:6000"}'
    moved = assign_kv_event_ports(specs, text)
    assert moved[0].kv_events_config == text  # worker 0 is launched with the config as given
    cfgs = [json.loads(s.kv_events_config or "") for s in moved[1:]]
    assert [c["endpoint"] for c in cfgs] == ["tcp://*:5558", "tcp://*:5559", "tcp://*:5560"]
    assert [c["replay_endpoint"] for c in cfgs] == ["tcp://*:6001", "tcp://*:6002", "tcp://*:6003"]
    # the conventional replay = endpoint + 1 cannot hold 4 workers: worker 1's PUB would take it
    with pytest.raises(ValueError, match="worker 1 \\(prefill\\) would bind endpoint port 5558, as worker 0"):
        assign_kv_event_ports(specs, '{"publisher":"zmq","replay_endpoint":"tcp://*:5558"}')
    # a worker without a config keeps none; a spec's own config (from a profile) is moved too
    own = [WorkerSpec("mixed"), WorkerSpec("mixed", kv_events_config='{"publisher":"zmq"}')]
    out = assign_kv_event_ports(own)
    assert out[0].kv_events_config is None
    assert json.loads(out[1].kv_events_config or "")["endpoint"] == "tcp://*:5558"


def test_server_info_descriptor() -> None:
    cfg = parse_kv_events_config('{"publisher":"zmq","topic":"kv","replay_endpoint":"tcp://*:5600"}')
    assert describe(cfg, block_size=16) == {
        "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557, "topic": "kv",
        "block_size": 16, "dp_size": 1, "replay_endpoint_port_base": 5600,
    }  # fmt: skip
    v6 = parse_kv_events_config('{"publisher":"zmq","endpoint":"tcp://[::1]:7000"}')
    assert (describe(v6, block_size=1) or {})["endpoint_host"] == "[::1]"
    for off in ('{"publisher":"null"}', '{"publisher":"zmq","endpoint":"ipc:///tmp/x"}'):
        assert describe(parse_kv_events_config(off), block_size=1) is None
    assert describe(None, block_size=1) is None
