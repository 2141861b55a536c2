"""The ZMQ end of a KV-event stream: the SUB socket, the replay DEALER, and a connection-drop watch.

Thin on purpose: frames in, requests out; what they mean is stream_state.py's and replay_cursor.py's,
what they change is kv_subscriber.py's. Both sockets bound what they buffer (ZMQ's receive high-water
mark) and the size of what they deliver (MAXMSGSIZE: a message over it is never decoded; libzmq then
drops the connection for good, which `Watch` notices: kv_subscriber.py's docstring).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from typing import Any

from infer_ctl.router.kvindex.replay_cursor import ReplayCursor, Step
from infer_ctl.router.kvindex.stream_state import ByteRate


class Dropped(Exception):
    """A socket's connection dropped with no reconnect (its monitor said so)."""


def _socket(kind: int, endpoint: str, *, rcv_hwm: int, max_message_bytes: int) -> Any:
    import zmq
    import zmq.asyncio

    sock = zmq.asyncio.Context.instance().socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        # The DEALER gets the live socket's receive limit (100,000), far over SGLang's buffer (10,000
        # batches by default): the publisher's ROUTER drops whatever does not fit our pipe, so ZMQ's
        # default (1,000 messages) holed every replay of a busy worker's buffer while this loop was busy.
        # Not unbounded (0): a hostile replay socket would fill memory at network speed meanwhile.
        sock.setsockopt(zmq.RCVHWM, rcv_hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        if "[" in endpoint:
            sock.setsockopt(zmq.IPV6, 1)
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


class LiveSocket:
    """The SUB socket of one publisher's topic. The receive in progress is kept across idle checks: a
    silent stream is not cancelled and re-armed with ZMQ every idle period (8 streams of a 2-process
    router over 4 workers did that 16 times a second), and a message already queued is taken without a
    timer (pyzmq tries a non-blocking receive first), after one turn of the event loop."""

    def __init__(self, endpoint: str, topic: bytes, *, rcv_hwm: int, max_message_bytes: int) -> None:
        import zmq

        self.sock = _socket(zmq.SUB, endpoint, rcv_hwm=rcv_hwm, max_message_bytes=max_message_bytes)
        self.watch: Watch | None = None
        self._pending: Any = None
        try:
            self.sock.setsockopt(zmq.SUBSCRIBE, topic)
            self.watch = Watch(self.sock)
            self.sock.connect(endpoint)
        except BaseException:
            self.close()
            raise

    def has_message(self) -> bool:
        return self._pending is not None and self._pending.done()

    def stop_receiving(self) -> None:
        """Cancel the receive in progress (a replay reads the sockets now)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    async def recv(self, idle_s: float) -> list[bytes] | None:
        """The next message, or None after `idle_s` of silence. Raises Dropped when the connection
        dropped for good (read at idle times only)."""
        if self._pending is None:
            self._pending = self.sock.recv_multipart()
        if self._pending.done():
            await asyncio.sleep(0)  # one turn of the loop per message, as the wait gave: requests run
        else:
            await asyncio.wait((self._pending,), timeout=idle_s)
            if not self._pending.done():
                if self.watch is not None and await self.watch.dropped():
                    raise Dropped
                return None
        fut, self._pending = self._pending, None
        frames: list[bytes] = fut.result()
        return frames

    def close(self) -> None:
        self.stop_receiving()
        try:
            if self.watch is not None:
                self.watch.close()
        finally:
            self.sock.close(linger=0)


class ReplaySocket:
    """The DEALER of one replay: `ask(seq)` sends a request from seq, `recv` waits for an answer's message."""

    def __init__(self, endpoint: str, *, rcv_hwm: int, max_message_bytes: int) -> None:
        import zmq

        self.sock = _socket(zmq.DEALER, endpoint, rcv_hwm=rcv_hwm, max_message_bytes=max_message_bytes)
        self.watch: Watch | None = None
        try:
            self.watch = Watch(self.sock)
            self.sock.connect(endpoint)
        except BaseException:
            self.close()
            raise

    async def steps(self, cur: ReplayCursor, *, idle_s: float, max_bytes_per_s: int
                    ) -> AsyncGenerator[tuple[Step, bytes], None]:
        """Ask from `cur.start` and feed what arrives (and the waits that time out) to the cursor: each
        of its steps, with the message's payload. Asks again where the cursor says
        (yielding the ask when it is a hole inside an answer, b"" when an answer is late). Ends with
        done or fail, or one of the socket's own: dropped (a batch over the size limit), malformed (a
        message that is no replay answer), flood (over `max_bytes_per_s`)."""
        budget = ByteRate(max_bytes_per_s, time.monotonic())
        await self.ask(cur.start)
        deadline = time.monotonic() + cur.wait_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                step = cur.timeout()
                if step.kind == "fail":
                    yield step, b""
                    return
                # a late answer to the earlier request is harmless: what it repeats is skipped
                await self.ask(step.seq)
                deadline = time.monotonic() + cur.wait_s
                continue
            try:
                frames = await self.recv(min(left, idle_s))
            except Dropped:
                yield Step("dropped"), b""
                return
            if frames is None:
                continue
            deadline = time.monotonic() + cur.wait_s  # an answer in progress is waited for, however long
            if budget.over(sum(len(f) for f in frames), time.monotonic()):
                yield Step("flood"), b""  # what a replay decodes holds the loop: its own budget
                return
            if len(frames) != 4 or frames[0] != b"" or len(frames[2]) != 8:
                yield Step("malformed", len(frames)), b""
                return
            step = cur.message(int.from_bytes(frames[2], "big", signed=True))
            yield step, frames[3]
            if step.kind in ("done", "fail"):
                return
            if step.kind == "ask":
                await self.ask(step.seq)

    async def ask(self, seq: int) -> None:
        await self.sock.send_multipart([b"", seq.to_bytes(8, "big")])

    async def recv(self, timeout_s: float) -> list[bytes] | None:
        """A message, or None after `timeout_s`; raises Dropped (no reconnect: a protocol error, a batch
        over the size limit)."""
        try:
            frames: list[bytes] = await asyncio.wait_for(self.sock.recv_multipart(), timeout_s)
        except TimeoutError:
            if self.watch is not None and await self.watch.dropped():
                raise Dropped from None
            return None
        return frames

    def close(self) -> None:
        try:
            if self.watch is not None:
                self.watch.close()
        finally:
            self.sock.close(linger=0)


class Watch:
    """A socket's connections dropped for good, from ZMQ's socket monitor (a sync PAIR on the same libzmq
    context, read without waiting). libzmq 4.3.5 follows a connection error (the peer went away) with
    EVENT_CONNECT_RETRIED: it reconnects by itself; a protocol error (a message over MAXMSGSIZE) is an
    EVENT_DISCONNECTED alone."""

    _n = 0

    def __init__(self, sock: Any) -> None:
        import zmq

        Watch._n += 1
        addr = f"inproc://inferctl-kv-monitor-{id(self)}-{Watch._n}"
        sock.monitor(addr, zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED)
        self.sock = sock
        self.pair: zmq.Socket[bytes] = zmq.Context.shadow(sock.context.underlying).socket(zmq.PAIR)
        self.pair.setsockopt(zmq.LINGER, 0)
        # libzmq sends each monitor event blocking, holding the monitored socket's monitor mutex
        # (socket_base.cpp monitor_event): with a bounded pipe, a backlog of events read only at idle
        # times would stall ZMQ's I/O thread, and disable_monitor() in close() would wait on that mutex
        # forever. RCVHWM 0 before connect makes the inproc pipe unbounded (a few bytes per event).
        self.pair.setsockopt(zmq.RCVHWM, 0)
        self.pair.connect(addr)

    def _last(self) -> int | None:
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        last = None
        while self.pair.poll(0, zmq.POLLIN):
            last = int(parse_monitor_message(self.pair.recv_multipart())["event"])
        return last

    async def dropped(self) -> bool:
        """Whether a connection dropped with no reconnect after it (read at idle times only)."""
        import zmq

        if self._last() != zmq.EVENT_DISCONNECTED:
            return False
        await asyncio.sleep(0.02)  # the retry event follows the disconnect at once when there is one
        return self._last() != zmq.EVENT_CONNECT_RETRIED

    def close(self) -> None:
        import zmq

        try:
            if not self.sock.closed:  # (a flooding stream's socket is closed before its pause)
                self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        finally:
            self.pair.close(linger=0)
