"""In-flight prompts shared by the router's processes (`router serve --processes N`): the flight board.

Why: in-flight prefix coalescing (router/coalesce.py) makes a burst's followers wait for the request
computing their prefix, and the pending overlay sends them to its worker. Each process knew only its
own flights, and SO_REUSEPORT spreads a tenant's burst over the processes by connection, so with two
processes about half of every burst computed the new system prompt again on another worker (or on the
same worker in the same prefill batch: SGLang's fcfs does not de-duplicate within a batch). Measured in
docs/benchmarks.md ("After the review of the simulator's batch-time matching"): one process closed
0.58 of the hit-rate headroom to the ceiling, two processes -0.82.

The board lives in the shared load block (router/shared_load.py, after the load rows): one row per
process, written by that process only, read by the others; no lock. A row is a header (a version bumped
after every change, the slots in use, and a probe of the process's string hashing) and `SLOTS` slots,
each one flight: its id, state, worker slot, the blocks the worker held at the routing decision, and the
first `BLOCKS` chain hashes of its routing text (core/routing/index.py `block_hashes`). The reader
mirrors every other process's published flights into its own pending overlay
(core/routing/coalesce.py `PendingBlocks`) as `Flight`s of its own, tagged `Remote`, so the picker and
the hold treat them as their own process's: the picker counts their blocks as held on their worker and
a request waits for the remote one computing its prefix. The mirror is brought up to date before every
routing decision (one version read per other process when nothing changed) and every `POLL_S` while a
request of this process waits for a remote flight.

Block hashes are Python's `hash` of strings: the supervisor gives every router process one random
`PYTHONHASHSEED` (router/procs.py), so the processes' chains agree. A row whose probe differs (a process
started some other way) is ignored, never misread.

Consistency without a lock: a slot's `GEN` is odd while its writer changes it, and a reader takes a
slot only when `GEN` is even and the same before and after it read the slot, and its hashes match the
slot's checksum. Every cell is one aligned 8-byte word (router/shared_load.py says why such a load or
store is never torn). Whatever a reader can still get wrong (a weakly ordered CPU showing a new id with
an old state) costs a hold, never an answer: a follower goes early and computes its prefix itself.
"""

from __future__ import annotations

import heapq
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infer_ctl.core.routing.coalesce import Flight, PendingBlocks

#: flights one process publishes at once (beyond them its flights stay its own: the hold is an
#: optimisation, a request never waits for a slot)
SLOTS = 128
#: chain hashes published per flight: 16 KiB of routing text at the default 64-character blocks, a
#: system prompt of 2,000-4,000 tokens; a longer prompt's tail is known to the other processes only
#: through the worker's KV events, which is where a follower's shared part is anyway
BLOCKS = 256
#: how often a request waiting for another process's flight looks at the board again
POLL_S = 0.002

# slot cells (LAST: a freed flight's state before it was freed, landed or failed)
GEN, ID, STATE, WORKER, HELD, N, SUM, LAST = range(8)
_SLOT_HEAD = 8
SLOT_CELLS = _SLOT_HEAD + BLOCKS
# row header cells (EPOCH: when its process attached, so that a restarted process's row, its versions,
# ids and generations counting from the start again, is never taken for the old one's)
VERSION, USED, PROBE, EPOCH = range(4)
_ROW_HEAD = 8
ROW_CELLS = _ROW_HEAD + SLOTS * SLOT_CELLS
# slot states
FREE, COMPUTING, LANDED, FAILED_WORKER, FAILED = range(5)


#: `_read`'s answer for a flight that is not mirrored (its worker unknown here)
_IGNORED = Flight("", ())


def probe() -> int:
    """This process's hash of a fixed string: equal in two processes exactly when their string hashes
    (and so their block chains) agree. Never 0 (a zeroed row is no process)."""
    return hash("inferctl flight board") | 1


def _checksum(hashes: Sequence[int]) -> int:
    return hash(tuple(hashes))


@dataclass
class Remote:
    """The tag of a mirrored flight: where it is published, and how it ended there."""

    process: int
    slot: int
    id: int
    gen: int
    #: its worker failed it (its followers are tried elsewhere) rather than its client going away
    worker_failed: bool = False


class FlightBoard:
    """One process's view of the board: its own row (`publish`, `state`, `free`) and a mirror of the
    others' (`sync`)."""

    def __init__(self, cells: memoryview, offset: int, processes: int, process: int,
                 slot_url: Callable[[int], str | None], url_slot: Callable[[str], int | None]) -> None:
        if len(cells) < offset + processes * ROW_CELLS:
            raise ValueError(f"the shared block holds {len(cells)} cells, the flight board needs "
                             f"{offset + processes * ROW_CELLS}")
        self.cells = cells
        self.offset = offset
        self.processes = processes
        self.process = process
        self.slot_url, self.url_slot = slot_url, url_slot
        self._row = offset + process * ROW_CELLS
        self._probe = probe()
        # ---- this process's row
        self._free = list(range(SLOTS))  # a heap: the lowest free slot first, so USED stays small
        self._mine: dict[Flight, int] = {}
        self._next_id = 1
        epoch = time.monotonic_ns()
        #: flights not published (every slot taken, or no slot for their worker)
        self.unpublished = 0
        # ---- the others' rows
        self._seen = [0] * processes  # each row's VERSION when it was last read whole
        self._epoch = [0] * processes  # each row's EPOCH the mirror is of
        self._mirror: list[dict[int, Flight]] = [{} for _ in range(processes)]  # slot -> mirrored flight
        self.foreign: set[int] = set()  # rows ignored: another hashing (logged once by the caller)
        cells[self._row:self._row + ROW_CELLS] = memoryview(bytes(ROW_CELLS * 8)).cast("q")
        cells[self._row + EPOCH] = epoch
        cells[self._row + PROBE] = self._probe
        cells[self._row + VERSION] = epoch

    # ---- writing this process's row ----------------------------------------------------------------
    def publish(self, flight: Flight, held_blocks: int) -> None:
        """`flight` (just added to this process's overlay) is in flight on its worker."""
        worker = self.url_slot(flight.worker)
        if worker is None or not self._free or not flight.hashes:
            self.unpublished += 1
            return
        slot = heapq.heappop(self._free)
        self._mine[flight] = slot
        hashes = flight.hashes[:BLOCKS]
        c, base = self.cells, self._slot(self.process, slot)
        gen = c[base + GEN] + 1
        c[base + GEN] = gen  # odd: being written
        c[base + ID] = self._next_id
        self._next_id += 1
        c[base + STATE] = COMPUTING
        c[base + WORKER] = worker
        c[base + HELD] = held_blocks
        c[base + N] = len(hashes)
        c[base + SUM] = _checksum(hashes)
        c[base + _SLOT_HEAD:base + _SLOT_HEAD + len(hashes)] = memoryview(array("q", hashes))
        c[base + GEN] = gen + 1
        if slot >= c[self._row + USED]:
            c[self._row + USED] = slot + 1
        c[self._row + VERSION] += 1

    def state(self, flight: Flight, state: int) -> None:
        """`flight` landed or failed (it stays published until `free`)."""
        slot = self._mine.get(flight)
        if slot is not None:
            self._set(slot, state)

    def free(self, flight: Flight) -> None:
        """`flight` left this process's overlay."""
        slot = self._mine.pop(flight, None)
        if slot is None:
            return
        heapq.heappush(self._free, slot)
        self.cells[self._row + USED] = max(self._mine.values(), default=-1) + 1
        self._set(slot, FREE)

    def _set(self, slot: int, state: int) -> None:
        c, base = self.cells, self._slot(self.process, slot)
        gen = c[base + GEN] + 1
        c[base + GEN] = gen
        if state == FREE:
            c[base + LAST] = c[base + STATE]
        c[base + STATE] = state
        c[base + GEN] = gen + 1
        c[self._row + VERSION] += 1

    def _slot(self, process: int, slot: int) -> int:
        return self.offset + process * ROW_CELLS + _ROW_HEAD + slot * SLOT_CELLS

    # ---- mirroring the others' rows ------------------------------------------------------------------
    def sync(self, pending: PendingBlocks, on_done: Callable[[Flight, str], None],
             failed_cause: Callable[[Flight], object], client_cause: object) -> int:
        """Bring the mirror of every other process's flights up to date in `pending`: new ones are added
        (tagged `Remote`, `on_done` set), ended ones land or fail (`failed_cause(flight)` for a worker's
        failure, `client_cause` otherwise) and leave it. Returns how many flights changed."""
        c, changed = self.cells, 0
        for p in range(self.processes):
            if p == self.process:
                continue
            row = self.offset + p * ROW_CELLS
            version = c[row + VERSION]
            if version == self._seen[p]:
                continue
            if c[row + PROBE] != self._probe or c[row + EPOCH] != self._epoch[p]:
                changed += self._drop_row(p, pending, client_cause)  # gone, restarted, or foreign
                self._epoch[p] = c[row + EPOCH]
                if c[row + PROBE] != self._probe:
                    if c[row + PROBE]:
                        self.foreign.add(p)
                    self._seen[p] = version
                    continue
            self.foreign.discard(p)
            whole = True
            mirror = self._mirror[p]
            used = c[row + USED]
            for slot in sorted(set(range(min(used, SLOTS))) | set(mirror)):
                base = self._slot(p, slot)
                gen = c[base + GEN]
                old = mirror.get(slot)
                tag = old.tag if old is not None and isinstance(old.tag, Remote) else None
                if tag is not None and tag.gen == gen:
                    continue
                if gen & 1:
                    whole = False  # being written: looked at again at the next sync
                    continue
                fid, state = c[base + ID], c[base + STATE]
                if old is not None and tag is not None:
                    same = tag.id == fid
                    if same:
                        tag.gen = gen
                        if state != FREE:  # still published: it landed or failed meanwhile
                            if state != COMPUTING:
                                changed += self._end(old, state, failed_cause, client_cause)
                            continue
                    # freed: how it ended (LAST); the slot holds another flight now: it ended between two
                    # looks, most likely landed (its owner frees a landed flight once its worker's KV
                    # events cover it; a failed one at once, but failures are rare) - its followers go
                    changed += self._end(old, c[base + LAST] if same else LANDED, failed_cause, client_cause)
                    pending.remove(old)
                    del mirror[slot]
                if state not in (COMPUTING, LANDED):
                    continue
                flight = self._read(p, slot, base, gen, fid, state)
                if flight is None:
                    whole = False  # changed while read
                    continue
                if flight is _IGNORED:
                    continue
                flight.on_done = lambda s, f=flight: on_done(f, s)
                pending.add(flight, c[base + HELD])
                mirror[slot] = flight
                changed += 1
            if whole:
                self._seen[p] = version
        return changed

    def _read(self, p: int, slot: int, base: int, gen: int, fid: int, state: int) -> Flight | None:
        c = self.cells
        n = c[base + N]
        url = self.slot_url(c[base + WORKER])
        if not 0 < n <= BLOCKS or url is None:
            return _IGNORED  # a worker this process does not know (yet): routed as its own flights say
        hashes = c[base + _SLOT_HEAD:base + _SLOT_HEAD + n].tolist()
        if c[base + GEN] != gen or _checksum(hashes) != c[base + SUM] or c[base + ID] != fid:
            return None  # changed while read
        flight = Flight(url, hashes, Remote(p, slot, fid, gen))
        if state == LANDED:
            flight.land()
        return flight

    @staticmethod
    def _end(flight: Flight, state: int, failed_cause: Callable[[Flight], object], client_cause: object) -> int:
        if not flight.computing:
            return 0
        if state in (LANDED, FREE, COMPUTING):  # (freed while computing: its owner stopped) its followers go
            flight.land()
        else:
            tag = flight.tag
            if state == FAILED_WORKER and isinstance(tag, Remote):
                tag.worker_failed = True
            flight.fail(failed_cause(flight) if state == FAILED_WORKER else client_cause)
        return 1

    def _drop_row(self, p: int, pending: PendingBlocks, client_cause: object) -> int:
        mirror, n = self._mirror[p], 0
        for flight in mirror.values():
            if flight.computing:
                flight.fail(client_cause)
                n += 1
            pending.remove(flight)
        mirror.clear()
        return n

    def status_doc(self) -> dict[str, object]:
        """This process's side of the board (`/admin/status` `coalesce.board`)."""
        return {"published": len(self._mine), "mirrored": sum(len(m) for m in self._mirror),
                "unpublished": self.unpublished, "foreign_processes": sorted(self.foreign)}

    def close(self) -> None:
        """This process stops: its row is emptied (its requests ended with it)."""
        for flight in list(self._mine):
            self.free(flight)
        self.cells[self._row + PROBE] = 0
        self.cells[self._row + VERSION] += 1
