"""One worker's KV-event stream: a ZMQ SUB socket, the replay DEALER, and the stream's health.

Wire (SGLang 0.5.23 `ZmqEventPublisher`, sglang/srt/disaggregation/kv_events.py; docs/simulator.md
"KV events"): PUB messages `[topic, seq (8 bytes big-endian), msgpack [ts, events, attn_dp_rank]]`, seq
from 0 per publisher; the ROUTER replay socket answers `["", start_seq]` with every buffered batch from
start_seq as `["", topic, seq, payload]`, then `["", "", -1, ""]`.

Health, which the stream's state says (`exact`, `replaying`, `untrusted`, `down`):

- start (and every worker restart): subscribe, then replay from seq 0, so what was published before the
  subscription landed (ZMQ's slow joiner) is not lost. A buffer that no longer starts at 0 cannot say
  what the worker holds: untrusted until the worker clears its cache.
- a gap (seq jumps): replay the missing range; if the publisher cannot (no replay endpoint, the range
  left its buffer, no answer to three requests within 7 x `kv_events.replay_timeout_s`), untrusted.
- seq going backwards (or back to 0): the publisher restarted: the blocks are dropped and the stream is
  replayed from 0.
- a batch that does not decode, has an unknown event, an oversized list, a store under a block the
  worker never stored, or would exceed `kv_events.max_blocks` (core/routing/blocks.py rejects it whole), and a
  publisher sending more than `kv_events.max_batches_per_s` (or `max_bytes_per_s`): counted, logged (at most once a minute per stream
  and kind), untrusted. A flooding stream's socket is closed for `flood_pause_s`.
- untrusted is repaired by an `AllBlocksCleared` (the blocks after it are the whole truth) or a worker
  restart; a worker that goes unhealthy is `down` (blocks dropped at once) until it is back.

- a message over `max_message_bytes` (ZMQ's MAXMSGSIZE on both sockets) is never delivered, so never
  decoded (msgspec holds the GIL: a 15 MB batch stalled every request for 0.4-0.8 s). libzmq (4.3.5)
  treats it as a protocol error: it drops the connection and does NOT reconnect (the session ends;
  only connection errors reconnect), so a SUB socket would stay silent for good. A socket monitor
  sees the drop; the subscription is opened again and the missed range replayed (counted as a gap);
  a replay whose connection drops the same way is rejected as `message_size` (counted, untrusted).

The parts: kv_socket.py (the ZMQ sockets, thin), stream_state.py (the sequence rules and the health
state, pure; replay_cursor.py the replay's), stream_replay.py (a replay: asking and applying), stream_blocks.py (decoding and applying batches to the
index); `KvStream` here runs the task that wires them.

An untrusted or down stream routes that worker on the predicted index (router/kvindex/kv_routing.py); the rest
of the fleet stays exact. The task yields to the event loop every few messages, so a flood never stalls
the request path, and ZMQ's receive high-water mark and maximum message size bound what it buffers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infer_ctl.core.routing.blocks import BatchEffect, EventRejected, WorkerBlocks
from infer_ctl.router.kvindex.kv_socket import Dropped, LiveSocket
from infer_ctl.router.kvindex.stream_blocks import StreamBlocks, decode
from infer_ctl.router.kvindex.stream_replay import StreamReplay
from infer_ctl.router.kvindex.stream_state import Flood, FloodWindow, StreamSequence

log = logging.getLogger("infer_ctl.router.kv")

_YIELD_EVERY = 32
#: how often a silent socket's monitor is read (a dropped connection is noticed within this)
_IDLE_S = 0.5


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    """A stream's bounds. The first five are router.kv_events settings (profile/router_kv.py declares their
    defaults and bounds; router/config.py `stream_settings` builds this from them): no default here. The
    rest are the stream's own constants.

    max_message_bytes: SGLang 0.5.23's largest legitimate message is one event of a radix node's N pages
    (docs/router.md "The exact index"); at page size 1 a BlockStored is N msgpack int64 hashes (9 bytes)
    plus N token ids (3 bytes under 65,536, else 5), about 14 bytes a token: the default 8 MiB is one
    ~595k-token store with chunked prefill off, or a ~930k-token eviction (BlockRemoved: hashes only). A
    longer context wants more."""

    max_blocks: int
    #: each storage medium's own bound (core/routing/blocks.py; None: max_blocks): a publisher naming
    #: four media otherwise holds up to 4 x max_blocks entries, ~25 bytes each (core/routing/blocktable.py)
    max_blocks_per_medium: int | None
    max_message_bytes: int
    replay_timeout_s: float
    max_batches_per_s: int
    max_event_blocks: int | None = None  # None: max_blocks (core/routing/blocks.py says why)
    rcv_hwm: int = 100_000
    #: bytes a second per publisher before it is a flood: decoding is C code that holds the event loop
    #: (~0.15-0.3 s for a 16 MiB batch on a loaded 2-core machine), so a publisher sending a few large
    #: batches a second, under max_batches_per_s, would otherwise stall every request
    max_bytes_per_s: int = 16 << 20
    flood_pause_s: float = 30.0
    #: a replay's own budget (replay_cursor.py): batches in one replay (SGLang buffers 10,000 by default:
    #: a replay of every one of them is legitimate, many times that is not a buffer) and bytes a second
    #: (what it decodes holds the loop; a legitimate replay is its buffer, read once)
    replay_max_batches: int = 100_000
    replay_max_bytes_per_s: int = 64 << 20


@dataclass
class StreamStats:
    batches: int = 0
    events: int = 0
    stored: int = 0
    removed: int = 0
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    restarts: int = 0
    untrusted: int = 0
    #: batches applied with an AllBlocksCleared in them
    cleared: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


class KvStream:
    """The stream of one publisher (one DP rank of one worker): the task that feeds the sockets'
    messages (kv_socket.py) to the sequence rules (stream_state.py, replay_cursor.py) and applies what
    they say to the blocks (stream_blocks.py)."""

    def __init__(self, worker: str, endpoint: str, replay_endpoint: str | None, topic: str, *,
                 settings: StreamSettings, on_event: Callable[[KvStream, str, int], None] | None = None,
                 rank: int = 0) -> None:
        self.worker = worker
        self.rank = rank
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.settings = settings
        #: metrics hook: (stream, what, count); what in batches, events, gap, replay_ok, replay_failed,
        #: restart, untrusted, rejected:<kind>, refused:<medium>
        self.on_event = on_event
        self.index = StreamBlocks(settings)
        self.seq = StreamSequence()
        self.stats = StreamStats()
        #: what the stores said: page size and bigram keys
        self.block_size: int | None = None
        self.bigram: bool | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._flood = FloodWindow(settings.max_batches_per_s, settings.max_bytes_per_s)
        self._logged: dict[str, float] = {}
        #: asking the replay socket for a range and applying what it answers (stream_replay.py)
        self.replay = StreamReplay(self)

    # ---- what the others read -----------------------------------------------------------------------
    @property
    def blocks(self) -> WorkerBlocks:
        return self.index.blocks

    @property
    def state(self) -> str:
        return self.seq.state

    @property
    def reason(self) -> str:
        return self.seq.reason

    @property
    def last_seq(self) -> int | None:
        return self.seq.last_seq

    @property
    def exact(self) -> bool:
        return self.seq.exact

    # ---- control (the health checker, the admin API) ------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def cancel(self) -> None:
        """Stop the task (its sockets close as it ends)."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    def restarted(self, why: str = "worker restarted") -> None:
        """The worker process is new: its cache is empty and its seq starts at 0 again."""
        self.stats.restarts += 1
        self.emit("restart")
        self.index.drop()
        self.seq.restarted(why)
        if self._wake is not None:
            self._wake.set()

    def down(self, why: str = "worker unhealthy") -> None:
        """The worker is unreachable: what it held is unknown from now on."""
        self.index.drop()
        self.seq.down(why)

    def up(self) -> None:
        """The worker answers again (same process): learn its cache again from the buffer."""
        if self.state == "down":
            self.restarted("worker healthy again")

    # ---- the task ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        st = self.settings
        while True:
            live: LiveSocket | None = None
            try:
                live = LiveSocket(self.endpoint, self.topic, rcv_hwm=st.rcv_hwm, max_message_bytes=st.max_message_bytes)
                await self._session(live)
            except asyncio.CancelledError:
                raise
            except Dropped:
                self._dropped()
                await asyncio.sleep(0.1)  # ZMQ's own reconnect interval: a publisher that keeps doing it is no busy loop
                continue
            except Flood as flood:
                self.reject("flood", str(flood))
                if live is not None:
                    live.close()
                await asyncio.sleep(st.flood_pause_s)
                self.restarted("flood pause over")
                continue
            except Exception as exc:  # never lose the task: the stream is untrusted, and tried again
                logged = self._logged.get("internal")
                self.untrust("internal", f"subscriber failed: {exc}")
                if self._logged.get("internal") != logged:  # the traceback too, once a minute (it retries each second)
                    log.exception("KV events: subscriber failed", extra={"worker": self.worker})
                await asyncio.sleep(1.0)
            finally:
                if live is not None:
                    live.close()

    def _dropped(self) -> None:
        """The SUB connection dropped (module docstring): what was published meanwhile is lost, a gap.
        An exact stream replays it on the next subscription."""
        self.stats.gaps += 1
        self.emit("gap")
        log.warning("KV events: a message over max_message_bytes dropped the subscription's connection (ZMQ "
                    "does not reconnect it): subscribing again", extra={
                        "worker": self.worker, "max_message_bytes": self.settings.max_message_bytes})
        self.seq.dropped()

    async def _session(self, live: LiveSocket) -> None:
        n = 0
        while True:
            if not live.has_message():  # a message in hand is handled first
                due, start = self.seq.take_replay()
                if due:
                    live.stop_receiving()  # the replay reads the sockets itself
                    if start is not None:
                        await self.replay.run(start)
            frames = await live.recv(_IDLE_S)
            if frames is None:
                continue
            size = sum(len(f) for f in frames)
            why = self._flood.over(size, time.monotonic())
            if why is not None:
                raise Flood(why)
            await self._live(frames)
            n += 1
            if n % _YIELD_EVERY == 0 or size > 1 << 16:  # a large batch took a while: let requests run
                await asyncio.sleep(0)  # a busy stream never holds the loop

    async def _live(self, frames: list[bytes]) -> None:
        if self.seq.ignores_live(self.replay_endpoint is not None):
            return
        if len(frames) != 3 or len(frames[1]) != 8:
            self.reject("malformed", f"a message of {len(frames)} frames")
            return
        seq = int.from_bytes(frames[1], "big")
        payload = frames[2]
        step = self.seq.live(seq)
        if step.kind == "apply":
            await self.apply_batch(seq, payload)
        elif step.kind == "repair":
            await self._repair(seq, payload)
        elif step.kind == "no_history":
            self.untrust("no_history", f"joined at seq {seq} and the worker has no replay endpoint")
        elif step.kind == "restart":
            self.stats.restarts += 1
            self.emit("restart")
            log.warning("KV events: seq went back: the publisher restarted",
                        extra={"worker": self.worker, "seq": seq, "last": self.last_seq})
            self.index.drop()
            if self.seq.restart_at(seq):
                await self.apply_batch(seq, payload)
            else:
                await self.replay.run(0)
                if self.seq.after_replay(seq) == "apply":
                    await self.apply_batch(seq, payload)
        elif step.kind == "gap":
            self.stats.gaps += 1
            self.emit("gap")
            log.warning("KV events: sequence gap, replaying it",
                        extra={"worker": self.worker, "expected": step.seq, "got": seq})
            await self.replay.run(step.seq)
            then = self.seq.after_replay(seq)
            if then == "apply":
                await self.apply_batch(seq, payload)
            elif then == "gap":
                last = self.last_seq
                self.untrust("gap", f"replay did not fill seq {last + 1 if last is not None else 0}..{seq - 1}")

    # ---- applying batches ---------------------------------------------------------------------------
    async def apply_batch(self, seq: int, payload: bytes) -> None:
        """Decode one batch and apply it in steps, yielding to the loop between them (stream_blocks.py)."""
        resets = self.index.resets
        try:
            events = await decode(payload)
            if resets != self.index.resets:  # dropped while it was decoded (restart, down): moot
                return
            eff = await self.index.apply(events)
        except EventRejected as exc:
            for medium, n in self.index.take_refused().items():
                self.emit(f"refused:{medium}", n)
            self.reject(exc.kind, str(exc))
            return
        if eff is None:  # dropped while it was applied (restart, down): not this stream's truth
            return
        self.seq.applied(seq)
        self._count(len(events), eff)

    async def _repair(self, seq: int, payload: bytes) -> None:
        """Untrusted: only a cleared cache tells the whole truth again."""
        resets = self.index.resets
        try:
            events = await decode(payload)
            if resets != self.index.resets or self.state != "untrusted":  # reset while it was decoded
                return
            eff = await self.index.repair(events)
        except EventRejected as exc:
            self.reject(exc.kind, str(exc))
            return
        if eff is None:
            return
        self.seq.repaired(seq)
        log.warning("KV events: stream repaired by AllBlocksCleared", extra={"worker": self.worker, "seq": seq})
        self._count(len(events), eff)

    def _count(self, n_events: int, eff: BatchEffect) -> None:
        st = self.stats
        st.batches += 1
        st.events += n_events
        st.stored += eff.stored
        st.removed += eff.removed
        st.cleared += eff.cleared
        if eff.block_size is not None:
            self.block_size = eff.block_size
        if eff.bigram is not None:
            self.bigram = eff.bigram
        self.emit("batches", 1)
        self.emit("events", n_events)

    def reject(self, kind: str, message: str) -> None:
        self.stats.rejected[kind] = self.stats.rejected.get(kind, 0) + 1
        self.emit(f"rejected:{kind}")
        self.untrust(kind, message)

    def untrust(self, kind: str, message: str) -> None:
        if kind in ("capacity", "flood"):
            # a stream at its memory bound (max_blocks, max_blocks_per_medium) or flooding (closed and
            # paused, then replayed from 0 into fresh blocks anyway): an untrusted stream is not
            # read (its worker is routed on the predicted index) and is repaired only into fresh blocks,
            # so its memory is freed now, not when the stream is reset (a flooding publisher held 1 GB
            # that way, issue 28 item 2). Other rejections keep what was held (bounded the same way).
            self.index.drop()
        if self.seq.untrusted(message):
            self.stats.untrusted += 1
            self.emit("untrusted")
        now = time.monotonic()
        if now - self._logged.get(kind, -1e9) >= 60.0:
            self._logged[kind] = now
            # the reason in the text too: a plain-text log (and a test's captured log) shows no extras
            log.warning("KV events: stream of %s untrusted (%s: %s), worker routed on the predicted index",
                        self.worker, kind, message[:300],
                        extra={"worker": self.worker, "kind": kind, "error": message[:300]})

    def emit(self, what: str, n: int = 1) -> None:
        if self.on_event is not None:
            self.on_event(self, what, n)

    def as_dict(self) -> dict[str, Any]:
        st = self.stats
        return {"rank": self.rank, "endpoint": self.endpoint, "replay_endpoint": self.replay_endpoint,
                "state": self.state, "reason": self.reason, "seq": self.last_seq, "blocks": len(self.blocks),
                "block_size": self.block_size, "bigram": self.bigram, "batches": st.batches, "events": st.events,
                "gaps": st.gaps, "replays": st.replays, "replay_failures": st.replay_failures,
                "restarts": st.restarts, "rejected": dict(st.rejected)}

