"""A KV-events subscriber for the tests: a real ZMQ SUB socket and a DEALER for the replay socket."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import msgspec
import zmq

from tests.ports import free_port as free_port  # re-exported: the KV-events tests import it from here

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def kv_config(**extra: Any) -> str:
    """A config on two free loopback ports (bind: a concrete host would otherwise be connected to)."""
    cfg = {"publisher": "zmq", "endpoint": f"tcp://127.0.0.1:{free_port()}", "bind": True,
           "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", **extra}  # fmt: skip
    return json.dumps(cfg)


class Subscriber:
    def __init__(self, endpoint: str, topic: bytes = b"") -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)

    def frames(self, timeout: float = 5.0) -> list[bytes]:
        if not self.sub.poll(int(timeout * 1000)):
            raise TimeoutError("no KV event batch within the timeout")
        frames: list[bytes] = self.sub.recv_multipart()
        return frames

    def batch(self, timeout: float = 5.0) -> tuple[int, Any]:
        """(seq, decoded [ts, events, rank]) of the next message."""
        _topic, seq, payload = self.frames(timeout)
        return int.from_bytes(seq, "big"), msgspec.msgpack.decode(payload)

    def sync(self, url: str, timeout: float = 10.0) -> int:
        """PUB drops what is sent before a subscription lands: flush the idle worker's cache until an
        AllBlocksCleared arrives, then everything later is seen. Returns that batch's seq.

        A batch of the previous test's last request can still be on its way when the subscription lands
        (the worker publishes after it answered): it is skipped. The publisher sends in order, so nothing
        older follows the AllBlocksCleared."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            httpx.post(url + "/flush_cache", timeout=5).raise_for_status()
            while self.sub.poll(200):
                seq, (_, events, _) = self.batch()
                if events == [{"type": "AllBlocksCleared"}]:
                    self.drain()
                    return seq
        raise TimeoutError("the subscription never landed")

    def drain(self) -> None:
        while self.sub.poll(100):
            self.sub.recv_multipart()

    def close(self) -> None:
        self.sub.close(linger=0)


def replay(endpoint: str, start: int, junk: tuple[list[bytes], ...] = (), timeout: float = 5.0) -> list[list[bytes]]:
    """Ask the replay socket for everything from `start` (after sending the `junk` messages, which it
    must ignore); the replies up to and including END_SEQ."""
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(endpoint)
    try:
        for message in junk:
            dealer.send_multipart(message)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        out: list[list[bytes]] = []
        while True:
            if not dealer.poll(int(timeout * 1000)):
                raise TimeoutError("the replay socket did not answer")
            reply = dealer.recv_multipart()
            out.append(reply)
            if reply[2] == END_SEQ:
                return out
    finally:
        dealer.close(linger=0)
