"""In-flight prompts shared by the router's processes (`router serve --processes N`): the flight board.

Why: in-flight prefix coalescing (router/request/coalesce.py) makes a burst's followers wait for the request
computing their prefix, and the pending overlay sends them to its worker. Each process knew only its
own flights, and SO_REUSEPORT spreads a tenant's burst over the processes by connection, so with two
processes about half of every burst computed the new system prompt again on another worker (or on the
same worker in the same prefill batch: SGLang's fcfs does not de-duplicate within a batch). Measured in
docs/benchmarks.md ("After the review of the simulator's batch-time matching"): one process closed
0.58 of the hit-rate headroom to the ceiling, two processes -0.82.

The board lives in the shared load block (router/fleet/shared_load.py, after the load rows): one row per
process, written by that process only, read by the others; no lock. A row is a header (a version bumped
after every change, the slots in use, and a probe of the process's string hashing) and `SLOTS` slots,
each one flight: its id, state, worker slot, the blocks the worker held at the routing decision, and the
first `BLOCKS` chain hashes of its routing text (core/routing/index.py `block_hashes`). The reader
mirrors every other process's published flights into its own pending overlay
(core/routing/coalesce.py `PendingBlocks`) as `Flight`s of its own, tagged `Remote`, so the picker and
the hold treat them as their own process's: the picker counts their blocks as held on their worker and
a request waits for the remote one computing its prefix. The mirror is brought up to date before every
routing decision (one version read per other process when nothing changed) and every `POLL_S` while a
request of this process waits for a remote flight; a mirrored flight joins the overlay only when a
decision here reads a chain on its worker starting with its first block (`materialize`).

Block hashes are Python's `hash` of strings: the supervisor gives every router process one random
`PYTHONHASHSEED` (router/daemon/procs.py), so the processes' chains agree. A row whose probe differs (a process
started some other way) is ignored, never misread.

Consistency without a lock: a slot's `GEN` is odd while its writer changes it, and a reader takes a
slot only when `GEN` is even and the same before and after it read the slot, and its hashes match the
slot's checksum. Every cell is one aligned 8-byte word (router/fleet/shared_load.py says why such a load or
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

# slot cells (LAST: a freed flight's state before it was freed, landed or failed; LATE: 1 when its
# process hears its landing only from its whole answer, long after its prefill - see `publish`)
GEN, ID, STATE, WORKER, HELD, N, SUM, LAST, LATE = range(9)
_SLOT_HEAD = 16  # two cache lines: a slot stays line-aligned
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
    """The tag of a mirrored flight: where it is published, and what its owner said of it."""

    process: int
    slot: int
    id: int
    #: its blocks before this one are the worker's or another flight's (HELD; a promotion lowers it)
    held: int = 0
    #: its landing is heard only from its whole answer (LATE): not waited for (coalesce.py `_lands_in_time`)
    late: bool = False
    #: its published chain's length (read whole by `materialize`)
    blocks: int = 0


def slot_base(offset: int, process: int, slot: int) -> int:
    """The first cell of `process`'s slot `slot` on a board at `offset`."""
    return offset + process * ROW_CELLS + _ROW_HEAD + slot * SLOT_CELLS


class OwnRow:
    """This process's row of the board: the flights it publishes, written by it alone."""

    def __init__(self, cells: memoryview, offset: int, process: int, url_slot: Callable[[str], int | None],
                 probe_value: int) -> None:
        self.cells = cells
        self.offset = offset
        self.process = process
        self.url_slot = url_slot
        #: the row's first cell
        self.base = offset + process * ROW_CELLS
        self._free = list(range(SLOTS))  # a heap: the lowest free slot first, so USED stays small
        #: the published flights and their slots
        self.slots: dict[Flight, int] = {}
        #: published flights that landed or failed, first ended first: a new flight takes the slot of
        #: the oldest when every slot is taken (an ended flight only tells where blocks are pending;
        #: a computing one is what another process's request waits for)
        self._ended: dict[Flight, None] = {}
        self._next_id = 1
        #: flights not published (every slot taken, or no slot for their worker)
        self.unpublished = 0
        epoch = time.monotonic_ns()
        row = self.base
        cells[row:row + ROW_CELLS] = memoryview(bytes(ROW_CELLS * 8)).cast("q")
        cells[row + EPOCH] = epoch
        cells[row + PROBE] = probe_value
        cells[row + VERSION] = epoch

    def publish(self, flight: Flight, held_blocks: int, late: bool = False) -> None:
        """FlightBoard.publish."""
        worker = self.url_slot(flight.worker)
        if self._ended and not self._free:
            self.free(next(iter(self._ended)))
        if worker is None or not self._free or not flight.hashes:
            self.unpublished += 1
            return
        slot = heapq.heappop(self._free)
        self.slots[flight] = slot
        hashes = flight.hashes[:BLOCKS]
        if slot >= self.cells[self.base + USED]:
            self.cells[self.base + USED] = slot + 1
        self._write(slot, {ID: self._next_id, STATE: COMPUTING, WORKER: worker, HELD: held_blocks,
                           LATE: int(late), N: len(hashes), SUM: _checksum(hashes)}, hashes)
        self._next_id += 1

    def state(self, flight: Flight, state: int) -> None:
        slot = self.slots.get(flight)
        if slot is not None:
            self._set(slot, state)
            self._ended[flight] = None

    def claim(self, flight: Flight, held_blocks: int) -> None:
        slot = self.slots.get(flight)
        if slot is not None:
            self._write(slot, {HELD: held_blocks})

    def free(self, flight: Flight) -> None:
        slot = self.slots.pop(flight, None)
        if slot is None:
            return
        self._ended.pop(flight, None)
        heapq.heappush(self._free, slot)
        self.cells[self.base + USED] = max(self.slots.values(), default=-1) + 1
        self._set(slot, FREE)

    def close(self) -> None:
        for flight in list(self.slots):
            self.free(flight)
        self.cells[self.base + PROBE] = 0
        self.cells[self.base + VERSION] += 1

    def _set(self, slot: int, state: int) -> None:
        cells = {STATE: state}
        if state == FREE:
            cells[LAST] = self.cells[slot_base(self.offset, self.process, slot) + STATE]
        self._write(slot, cells)

    def _write(self, slot: int, cells: dict[int, int], hashes: Sequence[int] = ()) -> None:
        """Change one of this process's slots as readers expect (module docstring): GEN odd while the
        cells (and the chain) are written, even again after, then the row's VERSION bumped."""
        c, base = self.cells, slot_base(self.offset, self.process, slot)
        gen = c[base + GEN] + 1
        c[base + GEN] = gen
        for cell, value in cells.items():
            c[base + cell] = value
        if hashes:
            c[base + _SLOT_HEAD:base + _SLOT_HEAD + len(hashes)] = memoryview(array("q", hashes))
        c[base + GEN] = gen + 1
        c[self.base + VERSION] += 1


class Mirror:
    """The other processes' rows, mirrored into this process's pending overlay (module docstring)."""

    def __init__(self, cells: memoryview, offset: int, processes: int, process: int,
                 slot_url: Callable[[int], str | None], probe_value: int) -> None:
        self.cells = cells
        self.offset = offset
        self.processes = processes
        self.process = process
        self.slot_url = slot_url
        self._probe = probe_value
        #: each row's VERSION when it was last read whole
        self.seen = [0] * processes
        self._epoch = [0] * processes  # each row's EPOCH the mirror is of
        #: per process, slot -> mirrored flight
        self.rows: list[dict[int, Flight]] = [{} for _ in range(processes)]
        self._gens = [[0] * SLOTS for _ in range(processes)]  # each slot's GEN when it was last looked at
        #: mirrored flights not in the overlay yet, by (worker, first block): added by `materialize`
        #: when a decision here looks at a chain starting so on that worker
        self.lazy: dict[tuple[str, int], dict[Flight, None]] = {}
        self.foreign: set[int] = set()  # rows ignored: another hashing (logged once by the caller)

    def sync(self, pending: PendingBlocks, on_done: Callable[[Flight, str], None],
             failed_cause: Callable[[Flight], object], client_cause: object) -> int:
        """Bring the mirror of every other process's flights up to date in `pending`: new ones are
        mirrored (tagged `Remote`, `on_done` set; they join the overlay at `materialize`), ended ones
        land or fail (`failed_cause(flight)` for a worker's failure, `client_cause` otherwise) and
        leave it. Returns how many flights changed."""
        c, changed = self.cells, 0
        for p in range(self.processes):
            if p == self.process:
                continue
            row = self.offset + p * ROW_CELLS
            version = c[row + VERSION]
            if version == self.seen[p]:
                continue
            if c[row + PROBE] != self._probe or c[row + EPOCH] != self._epoch[p]:
                changed += self._drop_row(p, pending, client_cause)  # gone, restarted, or foreign
                self._epoch[p] = c[row + EPOCH]
                if c[row + PROBE] != self._probe:
                    if c[row + PROBE]:
                        self.foreign.add(p)
                    self.seen[p] = version
                    continue
            self.foreign.discard(p)
            whole = True
            mirror, seen = self.rows[p], self._gens[p]
            used = min(max(c[row + USED], 0), SLOTS)
            # every slot's GEN in one strided copy: only the slots whose GEN moved since their last
            # look are looked at (a row changes at every request of its process; its unchanged slots
            # cost ~30 ns each here, ~300 ns each read one by one)
            g0 = row + _ROW_HEAD + GEN
            gens = c[g0:g0 + used * SLOT_CELLS:SLOT_CELLS].tolist()
            todo = [slot for slot, g in enumerate(gens) if g != seen[slot]]
            todo += [slot for slot in mirror if slot >= used and c[g0 + slot * SLOT_CELLS] != seen[slot]]
            for slot in sorted(todo) if len(todo) > 1 else todo:
                n = self._look(p, slot, mirror, pending, on_done, failed_cause, client_cause)
                if n < 0:
                    whole = False  # being written, or changed while read: looked at again at the next sync
                else:
                    changed += n
            if whole:
                self.seen[p] = version
        return changed

    def _look(self, p: int, slot: int, mirror: dict[int, Flight], pending: PendingBlocks,
              on_done: Callable[[Flight, str], None], failed_cause: Callable[[Flight], object],
              client_cause: object) -> int:
        """One slot whose GEN moved: how many flights changed, -1 when it must be looked at again."""
        c = self.cells
        base = slot_base(self.offset, p, slot)
        gen = c[base + GEN]
        if gen & 1:
            return -1  # being written
        changed = 0
        old = mirror.get(slot)
        tag = old.tag if old is not None and isinstance(old.tag, Remote) else None
        fid, state = c[base + ID], c[base + STATE]
        if old is not None and tag is not None:
            same = tag.id == fid
            if same and state != FREE:  # still published: it landed or failed meanwhile, or took over
                if state != COMPUTING:
                    changed += self._end(old, state, failed_cause, client_cause)
                elif (held := c[base + HELD]) < tag.held:  # promoted there: it computes more
                    tag.held = held
                    changed += pending.claim(old, held) > 0
                self._gens[p][slot] = gen
                return changed
            # freed: how it ended (LAST); the slot holds another flight now: it ended between two
            # looks, most likely landed (its owner frees a landed flight once its worker's KV
            # events cover it; a failed one at once, but failures are rare) - its followers go;
            # zeroed (id 0: the supervisor, for a process that died, while this look read it):
            # it failed with its process, and one follower here takes over
            end = c[base + LAST] if same else LANDED if fid else FAILED
            changed += self._end(old, end, failed_cause, client_cause)
            self._unmirror(old, pending)
            del mirror[slot]
        if state in (COMPUTING, LANDED):
            flight = self._read(p, slot, base, gen, fid, state)
            if flight is None:
                return -1  # changed while read
            if flight is not _IGNORED:
                flight.on_done = lambda s, f=flight: on_done(f, s)
                self.lazy.setdefault((flight.worker, flight.hashes[0]), {})[flight] = None
                mirror[slot] = flight
                changed += 1
        self._gens[p][slot] = gen
        return changed

    def _read(self, p: int, slot: int, base: int, gen: int, fid: int, state: int) -> Flight | None:
        c = self.cells
        n = c[base + N]
        url = self.slot_url(c[base + WORKER])
        if not 0 < n <= BLOCKS or url is None:
            return _IGNORED  # a worker this process does not know (yet): routed as its own flights say
        held, late, first = c[base + HELD], c[base + LATE], c[base + _SLOT_HEAD]
        if c[base + GEN] != gen or c[base + ID] != fid:
            return None  # changed while read
        # its first block only (what `materialize` files it under): the chain is read when a decision
        # here needs it - most mirrored flights end unread
        flight = Flight(url, [first], Remote(p, slot, fid, held=held, late=bool(late), blocks=n))
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
            flight.fail(failed_cause(flight) if state == FAILED_WORKER else client_cause)
        return 1

    def fail_worker(self, url: str, failed_cause: Callable[[Flight], object]) -> int:
        """This process took `url` out (unhealthy, removed): the other processes' flights computing
        there fail as that worker's failure (their followers here are tried elsewhere now, not when the
        owner's own health checks or admin snapshot catch up). Returns how many."""
        n = 0
        for mirror in self.rows:
            for flight in list(mirror.values()):
                if flight.worker == url and flight.computing:
                    flight.fail(failed_cause(flight))
                    n += 1
        return n

    def materialize(self, pending: PendingBlocks, worker: str, hashes: Sequence[int]) -> int:
        """The mirrored flights on `worker` whose chain starts as `hashes` does join the overlay (in
        the order they were mirrored), before a decision reads it for that chain. Why lazily: adding
        every other process's chains to the overlay and removing them again cost each process N - 1
        times its own overlay work per request (tens of microseconds a chain of 256 blocks), while a
        decision only ever reads chains that share its first block. Returns how many joined."""
        if not hashes:
            return 0
        key = (worker, hashes[0])
        bucket = self.lazy.pop(key, None)
        if not bucket:
            return 0
        n, later = 0, dict[Flight, None]()
        for flight in bucket:
            tag = flight.tag
            assert isinstance(tag, Remote)
            chain = self._chain(tag)
            if chain is None:  # being written, or replaced since the last sync (which then ends it)
                later[flight] = None
                continue
            flight.hashes = chain
            pending.add(flight, tag.held)
            n += 1
        if later:
            self.lazy[key] = later
        return n

    def _chain(self, tag: Remote) -> list[int] | None:
        """A mirrored flight's whole published chain, None when its slot does not hold it whole now."""
        c, base = self.cells, slot_base(self.offset, tag.process, tag.slot)
        gen = c[base + GEN]
        if gen & 1 or c[base + ID] != tag.id or c[self.offset + tag.process * ROW_CELLS + EPOCH] != \
                self._epoch[tag.process]:
            return None
        hashes = c[base + _SLOT_HEAD:base + _SLOT_HEAD + tag.blocks].tolist()
        if c[base + GEN] != gen or _checksum(hashes) != c[base + SUM]:
            return None
        return hashes

    def _unmirror(self, flight: Flight, pending: PendingBlocks) -> None:
        if flight.added:
            pending.remove(flight)
            return
        key = (flight.worker, flight.hashes[0])
        bucket = self.lazy.get(key)
        if bucket is not None:
            bucket.pop(flight, None)
            if not bucket:
                del self.lazy[key]

    def _drop_row(self, p: int, pending: PendingBlocks, client_cause: object) -> int:
        mirror, n = self.rows[p], 0
        for flight in mirror.values():
            if flight.computing:
                flight.fail(client_cause)
                n += 1
            self._unmirror(flight, pending)
        mirror.clear()
        self._gens[p] = [0] * SLOTS  # a restarted row's generations count from 0 again
        return n


class FlightBoard:
    """One process's view of the board: its own row (`publish`, `state`, `claim`, `free`: OwnRow) and a
    mirror of the others' (`sync`, `materialize`, `fail_worker`: Mirror)."""

    def __init__(self, cells: memoryview, offset: int, processes: int, process: int,
                 slot_url: Callable[[int], str | None], url_slot: Callable[[str], int | None]) -> None:
        if len(cells) < offset + processes * ROW_CELLS:
            raise ValueError(f"the shared block holds {len(cells)} cells, the flight board needs "
                             f"{offset + processes * ROW_CELLS}")
        value = probe()
        self.own = OwnRow(cells, offset, process, url_slot, value)
        self.mirror = Mirror(cells, offset, processes, process, slot_url, value)

    @property
    def unpublished(self) -> int:
        return self.own.unpublished

    @property
    def foreign(self) -> set[int]:
        return self.mirror.foreign

    def publish(self, flight: Flight, held_blocks: int, late: bool = False) -> None:
        """`flight` (just added to this process's overlay) is in flight on its worker; the worker or
        other flights compute its first `held_blocks` blocks. `late`: this process hears its landing
        only from its whole answer (a unary request with a long answer, its worker's KV events not
        trusted), so another process's requests should not wait for it (as this process's do not)."""
        self.own.publish(flight, held_blocks, late)

    def state(self, flight: Flight, state: int) -> None:
        """`flight` landed or failed (it stays published until `free`, or until its slot is needed)."""
        self.own.state(flight, state)

    def claim(self, flight: Flight, held_blocks: int) -> None:
        """`flight` computes its blocks from `held_blocks` on that nobody computes (a follower promoted
        in a failed leader's place: coalesce.py `_promote`)."""
        self.own.claim(flight, held_blocks)

    def free(self, flight: Flight) -> None:
        """`flight` left this process's overlay."""
        self.own.free(flight)

    def sync(self, pending: PendingBlocks, on_done: Callable[[Flight, str], None],
             failed_cause: Callable[[Flight], object], client_cause: object) -> int:
        """Mirror.sync."""
        return self.mirror.sync(pending, on_done, failed_cause, client_cause)

    def fail_worker(self, url: str, failed_cause: Callable[[Flight], object]) -> int:
        """Mirror.fail_worker."""
        return self.mirror.fail_worker(url, failed_cause)

    def materialize(self, pending: PendingBlocks, worker: str, hashes: Sequence[int]) -> int:
        """Mirror.materialize."""
        return self.mirror.materialize(pending, worker, hashes)

    def status_doc(self) -> dict[str, object]:
        """This process's side of the board (`/admin/status` `coalesce.board`)."""
        return {"published": len(self.own.slots), "mirrored": sum(len(m) for m in self.mirror.rows),
                "unpublished": self.own.unpublished, "foreign_processes": sorted(self.mirror.foreign)}

    def close(self) -> None:
        """This process stops: its row is emptied (its requests ended with it)."""
        self.own.close()
