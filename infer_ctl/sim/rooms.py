"""The prefill's table of bootstrap rooms: how a prefill request and a decode request meet.

Pure asyncio (no aiohttp). The real exchange (SGLang `disaggregation/common/conn.py` + Mooncake) is:
the decode looks the prefill up on its bootstrap server, sends its KV slot indices for the room, the
prefill (which waits in its bootstrap queue for exactly that) runs the forward and pushes the KV, and
the decode polls until the KV for the room has landed. Here the decode's "indices" message is a claim
carrying a digest of its prompt, so a router that pairs the wrong requests under one room is caught.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from typing import Any


def prompt_digest(input_ids: list[int]) -> str:
    return hashlib.blake2b(",".join(map(str, input_ids)).encode(), digest_size=12).hexdigest()


class RoomError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(eq=False)
class Room:
    room: int
    registered: asyncio.Event = field(default_factory=asyncio.Event)  # the prefill request arrived
    claimed: asyncio.Event = field(default_factory=asyncio.Event)  # the decode arrived and matched
    landed: asyncio.Event = field(default_factory=asyncio.Event)  # KV transfer finished (or failed)
    digest: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    transfer_ms: float = 0.0
    failure: str | None = None
    decode_alive: Any = None  # callable -> bool: is the decode's claim connection still open?
    decode: str | None = None  # the claiming decode's URL (the simulator's claim names it)


class RoomTable:
    def __init__(self) -> None:
        self.rooms: dict[int, Room] = {}
        self.bootstrap_failed = 0
        self.transfer_failed = 0

    def _get(self, room: int) -> Room:
        entry = self.rooms.get(room)
        if entry is None:
            entry = self.rooms[room] = Room(room)
        return entry

    @property
    def waiting_for_decode(self) -> int:
        return sum(1 for r in self.rooms.values() if r.registered.is_set() and not r.claimed.is_set())

    @property
    def inflight(self) -> int:
        return sum(1 for r in self.rooms.values() if r.claimed.is_set() and not r.landed.is_set())

    # -- prefill side -----------------------------------------------------------------------------
    def register(self, room: int, input_ids: list[int]) -> Room:
        entry = self._get(room)
        if entry.registered.is_set():
            # SGLang does not refuse a duplicate room: its KV sender state is keyed by room
            # (request_status, transfer_infos), so two live requests sharing one room corrupt each
            # other's transfer and decode requests abort ("Metadata ... bootstrap_room"). Fail both.
            self.transfer_failed += 1
            message = (
                f"KV transfer failed for bootstrap_room={room}: two requests on this prefill share the "
                "room at once (SGLang keys KV transfer state by room; with n > 1 in PD mode SGLang 0.5.23 "
                "gives every sample of a prompt the same room: send n = 1 requests instead)"
            )
            self.fail(entry, message)
            raise RoomError(500, message)
        entry.digest = prompt_digest(input_ids)
        entry.prompt_tokens = len(input_ids)
        entry.registered.set()
        return entry

    async def wait_for_decode(self, entry: Room, timeout: float) -> None:
        try:
            await asyncio.wait_for(entry.claimed.wait(), timeout)
        except TimeoutError:
            self.bootstrap_failed += 1
            raise RoomError(
                500,
                f"Request bootstrap_room={entry.room} timed out after {timeout:g}s in KVPoll.Bootstrapping: "
                "no decode server claimed this room (check that the router sends the same "
                "bootstrap_room to the paired decode)",
            ) from None
        if entry.failure:
            raise RoomError(500, entry.failure)

    def land(self, entry: Room, cached_tokens: int, transfer_ms: float) -> None:
        entry.cached_tokens = cached_tokens
        entry.transfer_ms = transfer_ms
        entry.landed.set()

    def fail(self, entry: Room, message: str) -> None:
        if entry.failure is None:
            entry.failure = message
        entry.claimed.set()
        entry.landed.set()

    def release(self, entry: Room) -> None:
        if self.rooms.get(entry.room) is entry:
            del self.rooms[entry.room]

    # -- decode side (the bootstrap server's handler) -----------------------------------------------
    async def claim(self, room: int, digest: str, timeout: float, decode_alive: Any = None,
                    decode: str | None = None) -> dict[str, Any]:
        """Wait for the prefill request of `room`, check it is the same prompt, then wait for the KV."""
        if room == 0:
            raise RoomError(400, "bootstrap_room 0 is never valid (SGLang reads room 0 as 'not yet landed')")
        entry = self._get(room)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            try:
                await asyncio.wait_for(entry.registered.wait(), timeout)
            except TimeoutError:
                raise RoomError(
                    504, f"no prefill request with bootstrap_room={room} arrived within {timeout:g}s"
                ) from None
            if entry.claimed.is_set() and entry.failure is None:
                raise RoomError(409, f"bootstrap_room {room} was already claimed by another decode request")
            if entry.digest != digest:
                self.transfer_failed += 1
                self.fail(
                    entry,
                    f"KV transfer failed for bootstrap_room={room}: the decode request's prompt does not "
                    "match the prefill request's (the router paired different requests under one room)",
                )
                raise RoomError(409, entry.failure or "")
            entry.decode_alive = decode_alive
            entry.decode = decode
            entry.claimed.set()
            try:
                await asyncio.wait_for(entry.landed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise RoomError(
                    504, f"KV for bootstrap_room={room} did not land within {timeout:g}s"
                ) from None
            if entry.failure:
                raise RoomError(500, entry.failure)
            return {
                "bootstrap_room": room,
                "prompt_tokens": entry.prompt_tokens,
                "cached_tokens": entry.cached_tokens,
                "transfer_ms": entry.transfer_ms,
            }
        finally:
            if not entry.registered.is_set():
                self.release(entry)  # the decode created a placeholder that no prefill ever filled
