"""KV events of running simulated workers over real ZMQ sockets on loopback: the envelope, stores on a
prefill, BlockRemoved on eviction, AllBlocksCleared on /flush_cache and on restart, the replay socket,
a decode that publishes nothing, and /server_info.kv_events discovery."""

from __future__ import annotations

import concurrent.futures as cf
import json
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest

from infer_ctl.core.kvevents.hashing import block_hashes, page_digests
from infer_ctl.sim.cluster import ThreadedSimCluster, WorkerSpec, start_cluster_in_thread
from tests.sim.kv_client import END_SEQ, Subscriber, kv_config, replay

FAST = 0.01


def _endpoints(spec: WorkerSpec) -> tuple[str, str]:
    cfg = json.loads(spec.kv_events_config or "")
    return cfg["endpoint"], cfg["replay_endpoint"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[ThreadedSimCluster]:
    specs = [
        # no speculation: a token-keyed tree, so hashes are of the prompt's own ids
        WorkerSpec("mixed", time_scale=FAST, speculative=False, cache_capacity_tokens=400,
                   kv_events_config=kv_config(topic="kv")),
        WorkerSpec("prefill", time_scale=FAST, page_size=4, kv_events_config=kv_config()),  # EAGLE3
        WorkerSpec("decode", time_scale=FAST, kv_events_config=kv_config()),
    ]  # fmt: skip
    c = start_cluster_in_thread(specs)
    yield c
    c.stop()


@pytest.fixture
def mixed_sub(cluster: ThreadedSimCluster) -> Iterator[Subscriber]:
    sub = Subscriber(_endpoints(cluster.workers[0].spec)[0])
    sub.sync(cluster.urls[0])
    yield sub
    sub.close()


def _generate(url: str, prompt: list[int], **body: Any) -> dict[str, Any]:
    r = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 1}, **body},
                   timeout=20)  # fmt: skip
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_a_prompt_is_published_as_one_block_stored_batch(cluster: ThreadedSimCluster, mixed_sub: Subscriber) -> None:
    prompt = list(range(1000, 1040))
    _generate(cluster.urls[0], prompt)
    topic, seq_bytes, payload = mixed_sub.frames()
    assert topic == b"kv" and len(seq_bytes) == 8
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert isinstance(ts, float) and rank == 0
    assert events == [
        {"type": "BlockStored", "block_hashes": block_hashes(page_digests(prompt, 1, None)),
         "parent_block_hash": None, "token_ids": prompt, "block_size": 1, "lora_id": None, "medium": "GPU"}
    ]  # fmt: skip
    # a continuation is chained to the last block of what it extends
    longer = [*prompt, 7, 8, 9]
    _generate(cluster.urls[0], longer)
    _, (_, (event,), _) = mixed_sub.batch()
    assert event["parent_block_hash"] == events[0]["block_hashes"][-1]
    assert event["token_ids"] == [7, 8, 9]
    assert event["block_hashes"] == block_hashes(page_digests(longer, 1, None))[-3:]


def test_eviction_publishes_block_removed(cluster: ThreadedSimCluster, mixed_sub: Subscriber) -> None:
    first = list(range(2000, 2300))
    _generate(cluster.urls[0], first)
    _, (_, stored, _) = mixed_sub.batch()
    _generate(cluster.urls[0], list(range(3000, 3300)))  # 600 > 400 tokens: the first prompt goes
    _, (_, events, _) = mixed_sub.batch()
    assert [e["type"] for e in events] == ["BlockStored", "BlockRemoved"]
    assert events[1]["block_hashes"] == stored[0]["block_hashes"]
    again = _generate(cluster.urls[0], first)
    assert again["meta_info"]["cached_tokens"] == 0


def test_flush_cache_publishes_all_blocks_cleared(cluster: ThreadedSimCluster, mixed_sub: Subscriber) -> None:
    _generate(cluster.urls[0], list(range(4000, 4010)))
    mixed_sub.batch()
    assert httpx.post(cluster.urls[0] + "/flush_cache").status_code == 200
    _, (_, events, _) = mixed_sub.batch()
    assert events == [{"type": "AllBlocksCleared"}]


def test_replay_sends_the_missing_range_then_end_seq(cluster: ThreadedSimCluster, mixed_sub: Subscriber) -> None:
    _generate(cluster.urls[0], list(range(5000, 5010)))
    seq, _ = mixed_sub.batch()
    _generate(cluster.urls[0], list(range(6000, 6010)))
    last, _ = mixed_sub.batch()
    replay_endpoint = _endpoints(cluster.workers[0].spec)[1]
    replies = replay(replay_endpoint, seq, junk=([b"not", b"a", b"request", b"at all"],))
    assert replies[-1] == [b"", b"", END_SEQ, b""]
    got = [(r[1], int.from_bytes(r[2], "big")) for r in replies[:-1]]
    assert got == [(b"kv", s) for s in range(seq, last + 1)]  # the same topic, seq and payload as live
    assert msgspec.msgpack.decode(replies[0][3])[1][0]["token_ids"] == list(range(5000, 5010))
    # nothing buffered past the end: only the marker
    assert replay(replay_endpoint, last + 1) == [[b"", b"", END_SEQ, b""]]


def test_a_restarted_worker_starts_again_at_seq_0_with_all_blocks_cleared(cluster: ThreadedSimCluster) -> None:
    url = cluster.urls[0]
    _generate(url, list(range(7000, 7010)))
    cluster.stop_worker(0)
    cluster.start_worker(0)
    first = replay(_endpoints(cluster.workers[0].spec)[1], 0)
    assert len(first) == 2 and int.from_bytes(first[0][2], "big") == 0
    assert msgspec.msgpack.decode(first[0][3])[1] == [{"type": "AllBlocksCleared"}]
    assert _generate(url, list(range(7000, 7010)))["meta_info"]["cached_tokens"] == 0


def test_an_eagle_prefill_publishes_bigram_pages(cluster: ThreadedSimCluster) -> None:
    prefill = cluster.workers[1]
    sub = Subscriber(_endpoints(prefill.spec)[0])
    try:
        sub.sync(prefill.url)
        prompt = list(range(100, 111))  # 11 tokens, 10 bigrams, 2 whole pages of 4
        body = {"bootstrap_host": "127.0.0.1", "bootstrap_port": prefill.bootstrap_port, "bootstrap_room": 77}
        with cf.ThreadPoolExecutor(2) as pool:  # a PD pair: the decode waits for the prefill's KV
            decode = pool.submit(_generate, cluster.urls[2], prompt, **body)
            _generate(prefill.url, prompt, **body)
            decode.result()
        _, (_, (event,), _) = sub.batch()
    finally:
        sub.close()
    pairs = [[a, a + 1] for a in range(100, 108)]
    assert event["token_ids"] == pairs and event["block_size"] == 4
    assert len(event["block_hashes"]) == 2
    # the decode (no radix cache, as SGLang's) published nothing, not even its start-up clear
    assert replay(_endpoints(cluster.workers[2].spec)[1], 0) == [[b"", b"", END_SEQ, b""]]


def test_server_info_describes_each_workers_publisher(cluster: ThreadedSimCluster) -> None:
    for w in cluster.workers:
        info = httpx.get(w.url + "/server_info").json()
        endpoint, replay_endpoint = _endpoints(w.spec)
        assert info["kv_events_config"] == w.spec.kv_events_config
        assert info["page_size"] == w.spec.page_size
        assert info["kv_events"] == {
            "publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": int(endpoint.rsplit(":", 1)[1]),
            "topic": "kv" if w.spec.role == "mixed" else "", "block_size": w.spec.page_size, "dp_size": 1,
            "replay_endpoint_port_base": int(replay_endpoint.rsplit(":", 1)[1]),
        }  # fmt: skip


def test_a_worker_without_kv_events_advertises_none() -> None:
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST)]) as c:
        info = httpx.get(c.urls[0] + "/server_info").json()
        assert info["kv_events"] is None and info["kv_events_config"] is None


def test_a_taken_port_fails_the_start_with_a_remedy() -> None:
    from infer_ctl.sim.kv_publisher import KvEventsBindError

    cfg = kv_config()
    spec = WorkerSpec("mixed", time_scale=FAST, kv_events_config=cfg)
    with start_cluster_in_thread([spec]), pytest.raises(KvEventsBindError, match="cannot open the KV events socket"):
        start_cluster_in_thread([spec])


def test_a_worker_that_cannot_listen_releases_its_kv_event_ports() -> None:
    from infer_ctl.sim.server import SimBindError

    cfg = kv_config()
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST)]) as busy:
        port = busy.workers[0].port
        with pytest.raises(SimBindError):
            start_cluster_in_thread([WorkerSpec("mixed", port=port, time_scale=FAST, kv_events_config=cfg)])
    with start_cluster_in_thread([WorkerSpec("mixed", time_scale=FAST, kv_events_config=cfg)]) as ok:
        assert ok.workers[0].kv_publisher is not None


def test_a_concrete_host_is_connected_to_as_sglang_does() -> None:
    """endpoint tcp://host:port without bind: the PUB socket connects, to a collector that binds."""
    import zmq

    from infer_ctl.sim.kv_config import parse_kv_events_config
    from infer_ctl.sim.kv_publisher import ZmqKvPublisher

    collector = zmq.Context.instance().socket(zmq.SUB)
    port = collector.bind_to_random_port("tcp://127.0.0.1")
    collector.setsockopt(zmq.SUBSCRIBE, b"")
    cfg = parse_kv_events_config(json.dumps({"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{port}"}))
    assert cfg is not None and not cfg.should_bind()
    publisher = ZmqKvPublisher(cfg)
    try:
        for _ in range(50):  # the connection lands asynchronously; PUB drops what it sends before
            publisher.publish([{"type": "AllBlocksCleared"}])
            if collector.poll(100):
                break
        _topic, _seq, payload = collector.recv_multipart()
        assert msgspec.msgpack.decode(payload)[1] == [{"type": "AllBlocksCleared"}]
    finally:
        publisher.close()
        collector.close(linger=0)
