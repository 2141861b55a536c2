"""A KV stream's replay (kv_subscriber.py `KvStream`): the replay DEALER (kv_socket.py) asked for every
batch from a seq, its answers fed to the replay's cursor (replay_cursor.py: holes asked again, bounded
tries) and applied to the stream in order; a replay that cannot end in sync untrusts the stream."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from infer_ctl.router.kvindex.kv_socket import ReplaySocket
from infer_ctl.router.kvindex.replay_cursor import ReplayCursor
from infer_ctl.router.kvindex.stream_state import Flood, StreamSequence

log = logging.getLogger("infer_ctl.router.kv")

#: replay requests before a silent replay socket untrusts the stream, each waiting twice as long as the
#: one before (kv_events.replay_timeout_s, then 2x, 4x): a publisher (or this router) slowed down by a loaded
#: host answers late, not never, and a stream untrusted for it stays so until the worker clears its cache
REPLAY_ATTEMPTS = 3
#: how often a silent replay socket is looked at, and how many answers are applied between yields
_IDLE_S = 0.25
_YIELD_EVERY = 32


class ReplayedStream(Protocol):
    """What a replay needs of its stream (kv_subscriber.py `KvStream`; a protocol, not an import: the
    stream holds its replay)."""

    worker: str
    replay_endpoint: str | None
    seq: StreamSequence
    #: StreamStats (replays, gaps, replay_failures) and StreamSettings (rcv_hwm, max_message_bytes,
    #: replay_max_bytes_per_s, replay_max_batches, replay_timeout_s), both in kv_subscriber.py
    stats: Any
    settings: Any

    @property
    def last_seq(self) -> int | None: ...

    @property
    def state(self) -> str: ...

    def emit(self, what: str, n: int = 1) -> None: ...

    def reject(self, kind: str, message: str) -> None: ...

    def untrust(self, kind: str, message: str) -> None: ...

    async def apply_batch(self, seq: int, payload: bytes) -> None: ...


class StreamReplay:
    """One stream's replays (one at a time: the stream's task awaits each)."""

    def __init__(self, stream: ReplayedStream) -> None:
        self.stream = stream

    async def run(self, start: int) -> None:
        """Ask the replay socket for every batch from `start` and apply them in order: the socket I/O
        here, the sequence rules in replay_cursor.py."""
        s = self.stream
        s.stats.replays += 1
        if s.replay_endpoint is None:
            if not s.seq.replay_without_endpoint(start):  # (else the first live batch must be seq 0)
                self.failed(start, "the worker has no replay endpoint")
            return
        from_seq = s.seq.replay_begins(start)
        cur = ReplayCursor(start, s.last_seq, attempts=REPLAY_ATTEMPTS, gap_asks=REPLAY_ATTEMPTS,
                           max_batches=s.settings.replay_max_batches, timeout_s=s.settings.replay_timeout_s)
        try:
            ok = await self._io(start, cur)
        except TimeoutError as exc:  # (the cursor's "no answer" arrives as a failed step, this is a guard)
            self.failed(start, str(exc) or "no replay answer")
            return
        if ok:
            s.seq.replayed(start, from_seq)
            s.emit("replay_ok")

    async def _io(self, start: int, cur: ReplayCursor) -> bool:
        """The replay's DEALER (kv_socket.py) fed to its cursor: whether it ended in sync (else the stream
        is already untrusted)."""
        s = self.stream
        assert s.replay_endpoint is not None
        st = s.settings
        sock = ReplaySocket(s.replay_endpoint, rcv_hwm=st.rcv_hwm, max_message_bytes=st.max_message_bytes)
        n = 0
        steps = sock.steps(cur, idle_s=_IDLE_S, max_bytes_per_s=st.replay_max_bytes_per_s)
        try:
            async for step, payload in steps:
                if step.kind == "done":
                    return True
                if step.kind == "fail":
                    self.failed(start, step.why)
                elif step.kind == "dropped":  # no reconnect: a protocol error, a batch over the limit
                    s.reject("message_size", f"replay from seq {start}: a batch over max_message_bytes "
                             f"({st.max_message_bytes} bytes) dropped the connection")
                elif step.kind == "malformed":
                    s.reject("malformed", f"a replay message of {step.seq} frames")
                elif step.kind == "flood":
                    raise Flood(f"a replay over {st.replay_max_bytes_per_s} bytes/s")
                elif step.kind == "ask":
                    s.stats.gaps += 1
                    s.emit("gap")
                    log.warning("KV events: a hole in the replay, asking again from the missing seq",
                                extra={"worker": s.worker, "seq": step.seq})
                    continue
                elif step.kind == "apply":
                    s.seq.replay_applies(step.seq)
                    await s.apply_batch(step.seq, payload)
                if s.state == "untrusted" or step.kind not in ("apply", "skip"):
                    return False
                n += 1
                if n % _YIELD_EVERY == 0 or len(payload) > 1 << 16:
                    await asyncio.sleep(0)
            return False
        finally:
            await steps.aclose()
            sock.close()

    def failed(self, start: int, why: str) -> None:
        s = self.stream
        s.stats.replay_failures += 1
        s.emit("replay_failed")
        s.untrust("replay", f"cannot replay from seq {start}: {why}")
