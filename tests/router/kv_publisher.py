"""A KV-events publisher the tests control: SGLang's wire (PUB `[topic, seq, payload]`, a ROUTER replay
socket answering `["", start]` with the buffered batches and the -1 end marker), but the test decides
what is sent, what is skipped (a gap), what the buffer keeps and what garbage goes out."""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import zmq

from tests.ports import free_port

END = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: list[int], parent: int | None, tokens: list[int], block_size: int = 1) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "lora_id": None, "medium": "GPU"}


def removed(hashes: list[int]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


class TestPublisher:
    __test__ = False  # not a test class

    def __init__(self, *, replay: bool = True) -> None:
        self.ctx = zmq.Context.instance()
        self.port = free_port()
        self.replay_port = free_port() if replay else None
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{self.port}")
        self.seq = 0
        #: seq -> payload, what the replay socket can serve (a test may drop entries)
        self.buffer: dict[int, bytes] = {}
        self.replay_requests: list[int] = []
        #: replay requests to read and leave unanswered (a publisher too loaded to answer in time)
        self.ignore_replays = 0
        #: seqs the next answer leaves out (a ROUTER that dropped what did not fit the subscriber's pipe)
        self.hole_once: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay:
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay_endpoint(self) -> str | None:
        return f"tcp://127.0.0.1:{self.replay_port}" if self.replay_port else None

    def batch(self, events: list[Any], *, send: bool = True, seq: int | None = None) -> int:
        """Publish one batch (or only buffer it: `send=False` makes a gap on the live stream)."""
        with self._lock:
            s = self.seq if seq is None else seq
            payload = msgspec.msgpack.encode([time.time(), events, 0])
            self.buffer[s] = payload
            if seq is None:
                self.seq += 1
        if send:
            self.pub.send_multipart([b"", s.to_bytes(8, "big"), payload])
        return s

    def raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def _serve(self) -> None:
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        try:
            while not self._stop.is_set():
                if not router.poll(50):
                    continue
                client, _, start = router.recv_multipart()
                first = int.from_bytes(start, "big")
                self.replay_requests.append(first)
                if self.ignore_replays > 0:
                    self.ignore_replays -= 1
                    continue
                with self._lock:
                    items = sorted((s, p) for s, p in self.buffer.items() if s >= first and s not in self.hole_once)
                    self.hole_once = set()
                for s, p in items:
                    router.send_multipart([client, b"", b"", s.to_bytes(8, "big"), p])
                router.send_multipart([client, b"", b"", END, b""])
        finally:
            router.close(0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        self.pub.close(0)
