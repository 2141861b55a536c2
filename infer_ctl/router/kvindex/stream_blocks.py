"""One KV-event stream's blocks: its batches decoded and applied to the index (core/routing/blocks.py).

No sockets and no health state: kv_subscriber.py hands it the payloads its sequence rules
(stream_state.py) say to apply, and turns an `EventRejected` into an untrusted stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, Protocol

from infer_ctl.core.routing.blocks import BatchEffect, EventRejected, WorkerBlocks


class BlockBounds(Protocol):
    """StreamSettings' bounds of the index (kv_subscriber.py)."""

    @property
    def max_blocks(self) -> int: ...
    @property
    def max_blocks_per_medium(self) -> int | None: ...
    @property
    def max_event_blocks(self) -> int | None: ...


#: an event's encoded size past which decoding it is worth a turn of the event loop after it
_YIELD_BYTES = 64 << 10
async def decode(payload: bytes) -> list[Any]:
    """A batch's events (`[ts, events, attn_dp_rank]`); EventRejected (decode, malformed) otherwise.

    Decoded one event at a time, yielding to the event loop after each large one: msgspec builds a
    Python int per block hash holding the loop, 30-60 ms for a 7.2 MB batch of 800,000 hashes on a
    quiet 2-core host, and a publisher sending two such batches a second stalled every request that
    often (issue 28 item 2: the flood's /health p99). The batch and its event list are only skipped
    over first (msgspec.Raw), so a batch of four 200,000-hash events holds the loop a quarter as long."""
    import msgspec

    try:
        batch = msgspec.msgpack.decode(payload, type=list[msgspec.Raw])
        events_raw = msgspec.msgpack.decode(batch[1], type=list[msgspec.Raw]) if len(batch) >= 2 else None
    except msgspec.ValidationError:
        events_raw = None
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
        raise EventRejected("decode", f"undecodable batch: {exc}") from None
    if events_raw is None:
        raise EventRejected("malformed", "a batch is not [ts, events, rank]")
    events: list[Any] = []
    for raw in events_raw:
        try:
            events.append(msgspec.msgpack.decode(raw))
        except (msgspec.DecodeError, ValueError, TypeError, RecursionError) as exc:
            raise EventRejected("decode", f"undecodable batch: {exc}") from None
        if len(raw) > _YIELD_BYTES:
            await asyncio.sleep(0)
    return events


class StreamBlocks:
    def __init__(self, bounds: BlockBounds) -> None:
        self.bounds = bounds
        self.blocks = self.new_blocks()
        #: bumped whenever the blocks are dropped (restart, down, untrusted): a batch being applied in
        #: steps across that is moot (`apply`)
        self.resets = 0
        self._refused: dict[str, int] = {}

    def new_blocks(self) -> WorkerBlocks:
        b = self.bounds
        return WorkerBlocks(max_blocks=b.max_blocks, max_event_blocks=b.max_event_blocks,
                            max_blocks_per_medium=b.max_blocks_per_medium)

    def drop(self) -> None:
        """Forget every block (the stream restarted, went down, or is untrusted for its memory). Freed
        at once: a medium's table is one array (core/routing/blocktable.py), ~1 ms for 3.2M blocks where
        their int objects, freed one by one, held the loop 107-160 ms."""
        self.resets += 1
        self.blocks.clear()

    def take_refused(self) -> dict[str, int]:
        """Blocks refused per medium since the last call (max_blocks_per_medium: the metric)."""
        out, self._refused = self._refused, {}
        return out

    async def apply(self, events: list[Any]) -> BatchEffect | None:
        """Apply one decoded batch in steps, yielding to the loop between them (core/routing/blocks.py
        `apply_steps`). None: the blocks were dropped meanwhile (a restart, down), so the batch is not
        this stream's truth. Raises EventRejected (nothing applied)."""
        blocks, resets = self.blocks, self.resets
        try:
            eff = await _stepped(blocks.apply_steps(events))
        except EventRejected:
            for medium, n in blocks.refused.items():
                self._refused[medium] = self._refused.get(medium, 0) + n
            blocks.refused.clear()
            raise
        return eff if resets == self.resets else None

    async def repair(self, events: list[Any]) -> BatchEffect | None:
        """An untrusted stream's batch: with an AllBlocksCleared in it, the blocks after the last one are
        the whole truth (applied into fresh blocks, which replace the old); else None, and None when the
        blocks were dropped meanwhile (as `apply`). In steps like `apply`: in one piece a batch of 1.5M
        hashes held the event loop 1.1 s. Raises EventRejected (the old blocks stay)."""
        clears = [i for i, ev in enumerate(events) if isinstance(ev, dict) and ev.get("type") == "AllBlocksCleared"]
        if not clears:
            return None
        resets = self.resets
        fresh = self.new_blocks()
        eff = await _stepped(fresh.apply_steps(events[clears[-1]:]))
        if resets != self.resets:
            return None
        self.blocks = fresh
        return eff


async def _stepped(steps: Generator[None, None, BatchEffect]) -> BatchEffect:
    """Run a batch's steps (core/routing/blocks.py `apply_steps`), yielding to the event loop between them."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            eff: BatchEffect = done.value
            return eff
        await asyncio.sleep(0)
