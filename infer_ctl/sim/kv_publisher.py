"""The ZMQ side of KV events: a PUB socket, a replay ROUTER socket and the thread that owns them.

Wire format, as SGLang 0.5.23's `ZmqEventPublisher` (sglang/srt/disaggregation/kv_events.py):

- every batch is one PUB message of three frames: `[topic, seq, payload]`, `seq` an 8-byte big-endian
  counter starting at 0 with each publisher (a restarted worker starts at 0 again), `payload` the msgpack
  of the array `[ts, events, attn_dp_rank]` (`EventBatch`; `ts` the wall clock when the step's events
  were taken, `attn_dp_rank` this publisher's rank);
- the replay socket (ROUTER, bound at `replay_endpoint`) answers a request `["", start_seq]` (8-byte
  big-endian; what a DEALER sends, a REQ adds the empty frame itself) with every batch still buffered
  (`buffer_steps` of them) whose seq >= start_seq, each as `["", topic, seq, payload]`, then the end
  marker `["", "", -1 as 8 signed big-endian bytes, ""]`; a request of any other shape is ignored.

The engine's step hands its log of tree changes to `publish`, which only timestamps and queues it: turning
it into events (`KvEventBuilder`: hashing every new page), encoding, sending, buffering and replay happen
on this publisher's own thread, so the simulated scheduler never waits for a hash or a socket (SGLang
hashes in its scheduler, in C++, and publishes from a thread like this one). The thread sleeps in `zmq.Poller` on the replay socket and on a pipe
that `publish` writes one byte to, so an idle worker costs no wake-ups and a replay request is answered
at once.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from infer_ctl.errors import InferctlError
from infer_ctl.sim.kv_config import KvEventsConfig
from infer_ctl.sim.kv_events import Event, Op

log = logging.getLogger("infer_ctl.sim.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_STOP = None  # the queue's shutdown sentinel


class KvEventsBindError(InferctlError):
    def __init__(self, endpoint: str, exc: Exception) -> None:
        super().__init__(
            f"cannot open the KV events socket {endpoint}: {exc}",
            remedy="give --kv-events-config another endpoint/replay_endpoint port, or stop whatever holds it",
        )


class ZmqKvPublisher:
    def __init__(
        self, cfg: KvEventsConfig, *, dp_rank: int = 0, build: Callable[[list[Op]], list[Event]] | None = None
    ) -> None:
        self.cfg = cfg
        self.dp_rank = dp_rank
        #: turns what `publish` is given into a batch's events, on the thread (None: it is the events)
        self._build = build
        self._topic = cfg.topic.encode()
        # Queue(0) is unbounded, as SGLang's max_queue_size 0 would be; a full queue makes publish wait,
        # as SGLang's scheduler does (the thread drains it whatever the engine does)
        self._queue: queue.Queue[tuple[float, list[Any]] | None] = queue.Queue(cfg.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=cfg.buffer_steps)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._fds: tuple[int, ...] = (self._wake_r, self._wake_w)
        self._ready = threading.Event()
        self._error: tuple[str, Exception] | None = None
        self._thread = threading.Thread(target=self._run, name="sim-kv-events", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join(timeout=1.0)
            self._close_pipe()
            raise KvEventsBindError(*self._error)

    # -- the engine's side --------------------------------------------------------------------------
    def publish(self, items: list[Any]) -> None:
        """One step's log (or, without `build`, its events): one batch, stamped now."""
        self._queue.put((time.time(), items))
        self._poke()

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued, then close the sockets (waits at most `timeout`)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._poke()
            self._thread.join(timeout=timeout)
        if not self._thread.is_alive():
            self._close_pipe()

    def _poke(self) -> None:
        if not self._fds:  # closed: the descriptor may already be another file's
            return
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):  # the pipe is full (the thread is awake anyway) or closed
            pass

    def _close_pipe(self) -> None:
        fds, self._fds = self._fds, ()
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the publisher thread -----------------------------------------------------------------------
    def _open(self) -> tuple[Any, Any]:
        import zmq  # only a worker that publishes loads pyzmq

        ctx: Any = zmq.Context.instance()
        cfg = self.cfg
        pub = ctx.socket(zmq.PUB)
        replay = None
        try:
            pub.set_hwm(cfg.hwm)
            ipv6 = "[" in cfg.endpoint or "::" in cfg.endpoint
            if ipv6:
                pub.setsockopt(zmq.IPV6, 1)
            try:
                if cfg.should_bind():
                    pub.bind(cfg.endpoint)
                else:
                    pub.connect(cfg.endpoint)
            except zmq.ZMQError as exc:
                self._error = (cfg.endpoint, exc)
                raise
            if cfg.replay_endpoint is not None:
                replay = ctx.socket(zmq.ROUTER)
                if "[" in cfg.replay_endpoint or "::" in cfg.replay_endpoint:
                    replay.setsockopt(zmq.IPV6, 1)
                try:
                    replay.bind(cfg.replay_endpoint)
                except zmq.ZMQError as exc:
                    self._error = (cfg.replay_endpoint, exc)
                    raise
        except zmq.ZMQError:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            raise
        return pub, replay

    def _run(self) -> None:
        import msgspec
        import zmq

        try:
            pub, replay = self._open()
        except Exception as exc:  # the constructor is waiting: it raises what happened
            if self._error is None:
                self._error = (self.cfg.endpoint, exc)
            self._ready.set()
            return
        self._ready.set()
        encode = msgspec.msgpack.Encoder().encode
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        seq = 0
        try:
            while True:
                ready = dict(poller.poll())
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                stop = False
                while True:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        stop = True
                        break
                    ts, items = item
                    try:
                        events = self._build(items) if self._build is not None else items
                    except Exception:  # never lose the thread; the stream then misses this step
                        log.exception("KV events: building a batch failed")
                        continue
                    if not events:  # a step that only split nodes: SGLang publishes nothing either
                        continue
                    payload = encode([ts, events, self.dp_rank])
                    seq_bytes = seq.to_bytes(8, "big")
                    try:
                        pub.send_multipart((self._topic, seq_bytes, payload))
                    except zmq.ZMQError as exc:  # SGLang logs and goes on; the batch stays replayable
                        log.warning("KV events: sending batch %d failed: %s", seq, exc)
                    self._buffer.append((seq, payload))
                    seq += 1
                if stop:
                    break
                # after the queue: a replay request sees every batch published before it was answered
                # (a restarted worker's AllBlocksCleared at seq 0 included, however the two raced here)
                if replay is not None and replay in ready:
                    self._serve_replay(replay)
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    def _serve_replay(self, replay: Any) -> None:
        import zmq

        while True:
            try:
                frames = replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                log.warning("KV events: ignoring a replay request of %d frames", len(frames))
                continue
            client, _, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self._buffer):
                if seq >= first:
                    replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
            replay.send_multipart((client, b"", b"", END_SEQ, b""))
